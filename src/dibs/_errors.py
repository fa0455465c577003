"""Every error dibs raises, under one root.

::

    DibsError
    ├── InvalidArgument     (also a ValueError) the call was wrong; nothing was written
    │   ├── UnknownTask     (also a LookupError) no task of that name is registered
    │   └── UnknownQueue    (also a LookupError) no task or app declares that queue
    ├── InTransaction       claim() was handed a connection with an open transaction
    ├── InEventLoop         (also a RuntimeError) a blocking run() was called inside a running event loop
    ├── Busy                SQLite stayed locked past its busy timeout
    ├── LeaseLost           the lease was taken over or finished; the write changed nothing
    ├── SchemaMissing       the database lacks the dibs tables, or has an older version of them
    ├── JobNotFound         (also a LookupError) no job with that id
    ├── JobFailed           the job whose result was asked for died or was cancelled
    ├── ResultTimeout       (also a TimeoutError) the job had not finished when the wait ran out
    ├── EventNotFound       (also a LookupError) no outbox event with that id
    └── BrokerUnavailable   an outbox publisher could not reach its broker; nothing was confirmed

    DibsWarning             (a UserWarning)
    └── FallbackWarning     the server is too old for the fast path; a slower correct one is used

Backend errors that dibs understands are translated at one boundary into these, with the driver's
exception kept as ``__cause__``. Errors dibs does not understand pass through unchanged.
"""

from __future__ import annotations

from typing import Any


class DibsError(Exception):
    """The root of every error dibs raises."""


class InvalidArgument(DibsError, ValueError):
    """A call had a bad argument. Nothing was written."""


class UnknownTask(InvalidArgument, LookupError):
    """No task of that name is registered with the app. Nothing was written."""


class UnknownQueue(InvalidArgument, LookupError):
    """No registered task and no ``App(queues=...)`` names that queue. Nothing was written."""


class SchemaMissing(DibsError):
    """The database has no dibs tables, or an older version of them: run ``dibs init``."""


class JobNotFound(DibsError, LookupError):
    """No job with that id exists (it may have been purged)."""


class JobFailed(DibsError):
    """The job whose result was asked for finished without one: it died or was cancelled.

    Args:
        message: What became of the job.
        job_id: The job's id.
        status: ``dead`` or ``cancelled``.
        error: Its stored error (type, message and traceback), if it has one.

    Attributes:
        job_id: The job's id.
        status: ``dead`` or ``cancelled``.
        error: Its stored error, if it has one.
    """

    def __init__(self, message: str, *, job_id: int, status: str, error: str | None) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.status = status
        self.error = error


class ResultTimeout(DibsError, TimeoutError):
    """The job had not finished when the wait for its result ran out; the job itself was left alone."""


class EventNotFound(DibsError, LookupError):
    """No outbox event with that id exists (it may have been purged)."""


class BrokerUnavailable(DibsError):
    """A publisher could not reach its broker (refused, timed out, dropped): nothing of the batch was confirmed.

    The relay gives the batch back unpublished, counts no retry against its events, and tries again later.
    """


class InTransaction(DibsError):
    """claim() was called on a connection that is inside a transaction. Nothing was written."""


class InEventLoop(DibsError, RuntimeError):
    """A service's blocking ``run()`` was called on a thread whose event loop is running: await ``arun()`` there."""


class Busy(DibsError):
    """SQLite was still locked by another writer when its busy timeout ran out. Nothing was claimed."""


class LeaseLost(DibsError):
    """A write presented a lease that is no longer held: it was taken over, released or finished.

    The write changed nothing. The holder must stop working on the row: another worker owns it now.

    Args:
        message: What was lost and what to do.
        leases: The leases that were lost.

    Attributes:
        leases: The leases that were lost, as :class:`~dibs.Lease` values.
    """

    def __init__(self, message: str, *, leases: tuple[Any, ...] = ()) -> None:
        super().__init__(message)
        self.leases = leases


class DibsWarning(UserWarning):
    """The root of every warning dibs emits."""


class FallbackWarning(DibsWarning):
    """The database is too old for the fast path, so a slower strategy with the same guarantees is used."""
