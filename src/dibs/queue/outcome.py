"""What becomes of a job whose run raised (or was stopped): a pure decision, apart from the writes.

The worker asks :func:`failed_outcome` with what it knows of the run, and writes what it answers:

* ``lost``: the lease was taken over while the job ran; the new owner decides, nothing is written here;
* ``cancelled``: someone asked to cancel it; finished as cancelled, never retried;
* ``released``: the worker is shutting down and the job may run again; given back with no attempt spent;
* ``retried``: scheduled again after the task's backoff;
* ``dead``: its last attempt, or an error its retry policy does not retry; kept with its error.
"""

from __future__ import annotations

from enum import Enum


class Outcome(str, Enum):
    """The fate of a run that did not succeed."""

    LOST = "lost"
    CANCELLED = "cancelled"
    RELEASED = "released"
    RETRIED = "retried"
    DEAD = "dead"


def failed_outcome(stop_reason: str | None, attempts: int, max_attempts: int, retryable: bool) -> Outcome:
    """The outcome of a run that raised or was stopped.

    ``stop_reason``: why the worker stopped the job, if it did (``lease lost``, ``cancelled``,
    ``shutdown``, ``timeout``); ``attempts``: the runs counted so far, this one included;
    ``retryable``: whether the task's retry policy retries this error.
    """
    if stop_reason == "lease lost":
        return Outcome.LOST
    if stop_reason == "cancelled":
        return Outcome.CANCELLED
    if stop_reason != "shutdown" and retryable and attempts < max_attempts:
        return Outcome.RETRIED
    if stop_reason == "shutdown":
        return Outcome.RELEASED
    return Outcome.DEAD
