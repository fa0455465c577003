"""Transactional tasks: the function runs in a transaction on the app's database, given as ``context.conn``,
and the job's completion (its result stored, the jobs waiting for it settled) is written in that same
transaction, fenced by the job's lease.

The transaction commits only when the function returned, the worker did not stop the run first (timeout,
cancel, shutdown, lease lost), and the fenced completion still found the job running under this lease: a run
whose lease was taken over commits nothing, so its writes happen once however often the job runs. A function
that raised is rolled back, and the job then takes the normal retry or dead path.

A sync function's transaction lives in its own thread from BEGIN to COMMIT (on SQLite that thread holds the
writer turn all along); an async function's on a connection of an asyncio engine the worker opens on the
same database through the family's asyncio driver.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy.engine import Engine
from sqlalchemy.exc import ArgumentError

from dibs._checks import checked_options
from dibs._errors import InvalidArgument
from dibs.dialects import async_url, backend_for
from dibs.engine import create_async_engine
from dibs.lease import Lease
from dibs.queue.job import JobContext
from dibs.queue.results import encoded_result
from dibs.queue.store import JobStore

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from dibs.queue.task import Task

#: How a transactional run ended, when its function returned: its writes and the completion committed;
#: rolled back because the lease was taken over (``lost``), because the worker had stopped the run
#: (``stopped``), or because what it returned cannot be kept as a result (``unkept``).
Ending = Literal["committed", "lost", "stopped", "unkept"]


@dataclass(frozen=True)
class Ran:
    """How a transactional run whose function returned ended; ``problem`` says why a result was not kept."""

    ending: Ending
    problem: InvalidArgument | None = None


COMMITTED = Ran("committed")
LOST = Ran("lost")
STOPPED = Ran("stopped")


class _Undone(Exception):
    """Rolls the run's transaction back, carrying how the run ended."""

    def __init__(self, ran: Ran) -> None:
        super().__init__(ran.ending)
        self.ran = ran


class TransactionalContext(JobContext):
    """The context of a transactional task's job: :attr:`conn` while the transaction is open, and no more
    stopping once it commits (the completion is fenced, so a run whose lease was lost commits nothing)."""

    def __init__(self, job_id: int, task: str, attempt: int, args: dict[str, Any]) -> None:
        super().__init__(job_id, task, attempt, args)
        self._conn: Any = None
        self._committing = False
        # stop() is called on the worker's loop, commits() in a sync task's thread.
        self._lock = threading.Lock()

    @property
    def conn(self) -> Any:
        """The connection of the job's transaction (see :attr:`JobContext.conn`)."""
        if self._conn is None:
            raise InvalidArgument(
                f"the transaction of job {self.job_id} is not open: context.conn is for use while the task's "
                "function runs, not before or after it"
            )
        return self._conn

    def stop(self, reason: str) -> bool:
        """As :meth:`JobContext.stop`; False once the run commits."""
        with self._lock:
            return False if self._committing else super().stop(reason)

    def commits(self) -> bool:
        """Whether the run may commit: True, and no stopping from now on, unless it was asked to stop."""
        with self._lock:
            self._committing = self.stop_reason is None
            return self._committing

    def opened(self, conn: Any) -> None:
        """Give the function its transaction's connection (None once it ended)."""
        self._conn = conn


def _result(context: TransactionalContext, returned: object) -> str | None:
    """The JSON to store of what the function returned; rolls back (_Undone) a run that was stopped, or
    whose result cannot be kept."""
    if not context.commits():
        raise _Undone(STOPPED)
    try:
        return None if returned is None else encoded_result(returned)
    except InvalidArgument as problem:
        raise _Undone(Ran("unkept", problem)) from None


def run_sync(
    engine: Engine,
    store: JobStore,
    lease: Lease,
    function: Callable[..., Any],
    context: TransactionalContext,
    /,
    **kwargs: Any,
) -> Ran:
    """Run a sync function and complete its job in one transaction, in this thread; what the function
    raised is raised again once its writes are rolled back."""
    try:
        with engine.connect() as conn, backend_for(engine.dialect).transaction(conn):
            context.opened(conn)
            text = _result(context, function(**kwargs))
            if not store.succeed_in(conn, lease, text):
                raise _Undone(LOST)
        return COMMITTED
    except _Undone as undone:
        return undone.ran
    finally:
        context.opened(None)


async def run_async(
    engine: AsyncEngine,
    store: JobStore,
    lease: Lease,
    function: Callable[..., Any],
    context: TransactionalContext,
    /,
    **kwargs: Any,
) -> Ran:
    """:func:`run_sync` for an async function, on a connection of an asyncio engine; a cancelled run is
    rolled back."""
    try:
        async with engine.connect() as conn, conn.begin():
            await conn.run_sync(backend_for(conn.dialect).begin_writing)
            context.opened(conn)
            text = _result(context, await function(**kwargs))
            if not await conn.run_sync(store.succeed_in, lease, text):
                raise _Undone(LOST)
        return COMMITTED
    except _Undone as undone:
        return undone.ran
    finally:
        context.opened(None)


def checked_async_options(value: object) -> dict[str, Any]:
    """The App's ``async_engine_options``, if they are options by name that leave the job's transaction alone;
    InvalidArgument otherwise."""
    options = checked_options(value, "async_engine_options")
    execution = options.get("execution_options")
    if "isolation_level" in options or (isinstance(execution, Mapping) and "isolation_level" in execution):
        raise InvalidArgument(
            "async_engine_options cannot set isolation_level: the worker begins each transactional run's "
            "transaction itself (in AUTOCOMMIT a failed run's writes would stay); leave it out"
        )
    return options


class Transactions:
    """The database a worker's transactional tasks write in: the app's engine for sync functions, and an
    asyncio engine on the same database for async ones (made with ``async_options``), opened when first
    needed and closed with the worker."""

    def __init__(self, engine: Engine, store: JobStore, async_options: Mapping[str, Any]) -> None:
        self.engine = engine
        self.store = store
        self.async_options = async_options
        self._async: AsyncEngine | None = None

    def call(
        self, lease: Lease, function: Callable[..., Any], is_async: bool, context: JobContext
    ) -> Callable[..., Any]:
        """The function to call with a job's arguments instead of ``function``: it runs ``function`` in the
        job's transaction and returns how that ended (a :class:`Ran`)."""
        if not isinstance(context, TransactionalContext):
            raise TypeError("a transactional run needs a TransactionalContext")
        if not is_async:
            return lambda **kwargs: run_sync(self.engine, self.store, lease, function, context, **kwargs)

        async def run(**kwargs: Any) -> Ran:
            # Opened here unless the App gave options (see check): an app with no async transactional task
            # needs no asyncio driver, and one that is missing fails the job with the error that says what
            # to install.
            if self._async is None:
                self._async = self._opened()
            return await run_async(self._async, self.store, lease, function, context, **kwargs)

        return run

    def check(self, tasks: Iterable[Task]) -> None:
        """Make the asyncio engine now if options were given for it and an async transactional task may need
        it: an option it does not know is the worker's error as it starts, not each job's."""
        if self.async_options and self._async is None and any(task.transactional and task.is_async for task in tasks):
            self._async = self._opened()

    def _opened(self) -> AsyncEngine:
        try:
            return create_async_engine(async_url(self.engine.url), **self.async_options)
        except (TypeError, ArgumentError) as exc:
            raise InvalidArgument(
                f"the App's async_engine_options were refused ({exc}); give options of dibs.create_async_engine"
            ) from exc

    async def close(self) -> None:
        """Close the asyncio engine's connections, if one was opened."""
        if self._async is not None:
            await self._async.dispose()
            self._async = None
