"""A job as stored, and the context a running job's function may ask for."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Row

from dibs._checks import checked_number, checked_seconds, checked_text
from dibs._errors import InvalidArgument
from dibs.queue.results import Finished, ResultWaiter
from dibs.schema import FINISHED, PROGRESS_MESSAGE_LIMIT, aware


@dataclass(frozen=True, kw_only=True)
class Job:
    """One job as stored: what to run, with what, and where it stands. Times are aware, in UTC.

    Attributes:
        id: The job's id.
        task: The task's registered name.
        queue: The queue it is in.
        args: Its arguments.
        priority: Higher runs first within a queue.
        status: waiting (for the jobs it was enqueued after), scheduled, queued, running, succeeded, dead or
            cancelled.
        run_at: When it may run (for a retried job, when its next attempt may run).
        attempts: How many times it has run.
        max_attempts: How many times it may run before it is dead.
        dedupe_key: While the job is live, no other live job has this key.
        ordering_key: Jobs with the same key run one at a time, in enqueue order.
        tag: Only workers serving this tag take it.
        enqueued_at: When it was enqueued.
        started_at: When its last run started.
        finished_at: When it finished.
        last_error: The last run's error and traceback.
        lease_owner: The worker that holds it, while one does.
        cancel_requested: Whether it was asked to stop while running.
        lease_expires_at: When the lease of the worker running it runs out, unless renewed.
        result_json: The JSON of what its task returned, once it succeeded (None when it returned None);
            :meth:`result` decodes it, waiting for it first if need be.
        progress: How far its task last said it had got, from 0 to 1 (None: it never said); see
            :meth:`JobContext.progress`.
        progress_message: The message that came with it, if any.

    Example:
        >>> job = app.get(42)
        >>> job.status, job.attempts
        ('succeeded', 1)
    """

    id: int
    task: str
    queue: str
    args: dict[str, Any]
    priority: int
    status: str
    run_at: datetime
    attempts: int
    max_attempts: int
    dedupe_key: str | None
    ordering_key: str | None
    tag: str | None
    enqueued_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    last_error: str | None
    lease_owner: str | None
    cancel_requested: bool
    lease_expires_at: datetime | None = None
    result_json: str | None = None
    progress: float | None = None
    progress_message: str | None = None

    @classmethod
    def from_row(cls, row: Row[Any]) -> Job:
        """The job a row of ``dibs_jobs`` holds."""
        values = row._mapping
        return cls(
            id=values["id"],
            task=values["task"],
            queue=values["queue"],
            args=json.loads(values["args"]),
            priority=values["priority"],
            status=values["status"],
            run_at=aware(values["run_at"]),
            attempts=values["attempts"],
            max_attempts=values["max_attempts"],
            dedupe_key=values["dedupe_key"],
            ordering_key=values["ordering_key"],
            tag=values["tag"],
            enqueued_at=aware(values["enqueued_at"]),
            started_at=aware(values["started_at"]),
            finished_at=aware(values["finished_at"]),
            last_error=values["last_error"],
            lease_owner=values["lease_owner"],
            cancel_requested=bool(values["cancel_requested"]),
            lease_expires_at=aware(values["lease_expires_at"]),
            result_json=values.get("result"),
            progress=values.get("progress"),
            progress_message=values.get("progress_message"),
        )

    @classmethod
    def made(cls, fields: dict[str, Any]) -> Job:
        """The job of these fields (every field, by name), as an enqueue just stored it."""
        # Filling the instance's dict at once costs a tenth of the frozen __init__, which sets each field on
        # its own: the cost that counts when a batch returns thousands of jobs.
        job = cls.__new__(cls)
        job.__dict__.update(fields)
        return job

    def result(self, timeout: float | None = None) -> Any:
        """What the job's task returned, waiting until the job finished.

        A job that finished when this value was read answers at once; else one waiter shared by the App
        looks for it (with every other pending wait, in one query per round).

        Args:
            timeout: The longest wait in seconds; None waits as long as it takes.

        Returns:
            The decoded JSON the task returned (None if it returned None).

        Raises:
            JobFailed: The job died or was cancelled; the error carries its stored error.
            ResultTimeout: It had not finished in time; the job is left alone.
            JobNotFound: The job is gone (it was purged).
            InvalidArgument: ``timeout`` is not a number of seconds (or a timedelta) of 0 or more.

        Example:
            >>> add.enqueue({"a": 1, "b": 2}).result(timeout=10)
            3
        """
        seconds = _timeout(timeout)
        finished = self._finished()
        if finished is None:
            finished = self._waiter().wait(self.id, seconds)
        return finished.value()

    async def aresult(self, timeout: float | None = None) -> Any:
        """What the job's task returned, awaited on the running loop; as :meth:`result`.

        Args:
            timeout: The longest wait in seconds; None waits as long as it takes.

        Returns:
            The decoded JSON the task returned (None if it returned None).

        Raises:
            JobFailed: The job died or was cancelled; the error carries its stored error.
            ResultTimeout: It had not finished in time; the job is left alone.
            JobNotFound: The job is gone (it was purged).
            InvalidArgument: ``timeout`` is not a number of seconds (or a timedelta) of 0 or more.
        """
        seconds = _timeout(timeout)
        finished = self._finished()
        if finished is None:
            finished = await self._waiter().await_finished(self.id, seconds)
        return finished.value()

    def _finished(self) -> Finished | None:
        if self.status in FINISHED:
            return Finished(self.id, self.status, self.result_json, self.last_error)
        return None

    def _waiter(self) -> ResultWaiter:
        waiter: ResultWaiter | None = getattr(self, "_results", None)
        if waiter is None:
            raise InvalidArgument(
                f"this Job value of job {self.id} has no App to wait through (it was made or unpickled outside "
                f"one); wait with app.get({self.id}).result()"
            )
        return waiter

    def __getstate__(self) -> dict[str, Any]:
        # The waiter holds the App's engine, which neither pickles nor deep-copies: a job unpickled (from a
        # cache, in another process) waits through an App of its own, as _waiter says.
        state = dict(self.__dict__)
        state.pop("_results", None)
        return state

    def __copy__(self) -> Job:
        # A shallow copy is still the App's job: it keeps the waiter __getstate__ leaves out.
        job = type(self).__new__(type(self))
        job.__dict__.update(self.__dict__)
        return job

    def waited_by(self, waiter: ResultWaiter) -> Job:
        """This job, its :meth:`result` served by ``waiter`` (the App does this for the jobs it returns)."""
        # Not a field: the waiter is how to wait, not part of the job (equality, asdict and repr ignore it).
        object.__setattr__(self, "_results", waiter)
        return self


class JobContext:
    """Given to a task function that has a ``context`` parameter: which job this is, and whether it
    should stop (it was cancelled, timed out, or the worker is shutting down past its grace period).

    Example:
        >>> @app.task
        ... def export(report: str, context: dibs.JobContext) -> None:
        ...     for chunk in chunks(report):
        ...         if context.should_stop:
        ...             return  # cancelled or shutting down: stop between chunks
        ...         write(chunk)
    """

    def __init__(self, job_id: int, task: str, attempt: int, args: dict[str, Any]) -> None:
        self.job_id = job_id
        self.task = task
        self.attempt = attempt
        self.args = args
        self.stop_reason: str | None = None
        #: The results of the jobs this one waited for (``after=``, a chain's previous step, a group's
        #: members), in the order they were given; None for one that returned None, or did not succeed
        #: (with ``on_parent_failure="run"``). Empty for a job that waited for none.
        self.parent_results: list[Any] = []
        # Made on first wait(): most jobs never wait, and an Event costs more than a no-op job.
        self._event: threading.Event | None = None
        #: What the job last reported with :meth:`progress`: how far it got, and the message (None: nothing).
        self.reported: tuple[float, str | None] | None = None
        self._on_progress: Callable[[JobContext], None] | None = None

    @property
    def conn(self) -> Any:
        """The connection of the job's transaction, in a transactional task (``@app.task(transactional=True)``):
        a SQLAlchemy ``Connection``, or an ``AsyncConnection`` for an async task. What the function writes
        through it commits with the job's completion, or not at all.

        Raises:
            InvalidArgument: The task is not transactional.
        """
        raise InvalidArgument(
            f"context.conn is given only to transactional tasks, and task {self.task!r} is not one; register it "
            "with @app.task(transactional=True) to have its writes through context.conn commit with the job's "
            "completion"
        )

    @property
    def should_stop(self) -> bool:
        """True once the job was asked to stop; a long job checks it and returns (or raises) early."""
        return self.stop_reason is not None

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds`` (in a sync task), waking at once if asked to stop.

        Args:
            seconds: The longest sleep.

        Returns:
            True if the job was asked to stop.
        """
        if self._event is None:
            self._event = threading.Event()
        # Checked after the event exists: stop() sets the reason before it looks for the event.
        if self.stop_reason is not None:
            return True
        return self._event.wait(seconds)

    def progress(self, fraction: float, message: str | None = None) -> None:
        """Report how far the job has got, for ``app.get(id)``, ``dibs jobs show`` and the dashboard.

        Cheap enough for a tight loop: the worker writes the latest report of each running job at most once
        a second (all of them in one transaction, each fenced by its lease), so reports in between only
        replace the one waiting. The last report before the job ends may not be written.

        Args:
            fraction: From 0 (nothing done) to 1 (all done).
            message: A short note of where it stands, such as ``"3 of 7 files"`` (at most 200 characters).

        Raises:
            InvalidArgument: ``fraction`` is not a number from 0 to 1, or ``message`` is not short text.

        Example:
            >>> @app.task
            ... def resize(paths: list[str], context: dibs.JobContext) -> None:
            ...     for done, path in enumerate(paths, 1):
            ...         shrink(path)
            ...         context.progress(done / len(paths), f"{done} of {len(paths)} images")
        """
        done = checked_number(fraction, "a job's progress", 0.0, 1.0)
        if message is not None:
            message = checked_text(message, "a progress message", PROGRESS_MESSAGE_LIMIT)
        self.reported = (done, message)
        if self._on_progress is not None:
            self._on_progress(self)

    def reports_to(self, on_progress: Callable[[JobContext], None]) -> None:
        """Call ``on_progress`` with this context at each :meth:`progress` report (the worker does this)."""
        self._on_progress = on_progress

    def stop(self, reason: str) -> bool:
        """Ask the job to stop (the worker calls this).

        Args:
            reason: Why, as :attr:`stop_reason` then tells the job.

        Returns:
            Whether the job is to be stopped; False once it is too late (a transactional job committing).
        """
        if self.stop_reason is None:
            self.stop_reason = reason
            if self._event is not None:
                self._event.set()
        return True


def _timeout(timeout: object) -> float | None:
    """A result wait's ``timeout`` in seconds (None: no limit), checked before anything waits."""
    return None if timeout is None else checked_seconds(timeout, "timeout", zero=True)
