"""Job results: what a task returned, kept as JSON with its job, and one shared waiter per App for those
who wait for it.

A task that returns None stores nothing: its success is written in the worker's batch as before. Any
other value is encoded here (JSON, at most :data:`MAX_RESULT_BYTES`) and written with the job's
completion, in the same fenced statement.

Many callers may wait for many jobs at once. They do not poll each on their own: :class:`ResultWaiter`
keeps every pending wait of one App and serves them all from one thread, with one query per round for
all the jobs waited for, backing off while nothing finishes.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dibs._errors import InvalidArgument, JobFailed, JobNotFound, ResultTimeout
from dibs.engine import connected
from dibs.schema import FINISHED, SUCCEEDED, jobs

#: The most bytes of JSON a task's result may take; a larger one fails the job instead.
MAX_RESULT_BYTES = 1_000_000
#: The waiter's first and longest pause between two looks at the jobs waited for.
FIRST_POLL, LONGEST_POLL = 0.01, 0.5
#: Ids per query of the waiter.
_CHUNK = 1000


def encoded_result(value: Any, limit: int = MAX_RESULT_BYTES) -> str:
    """The JSON stored for a task's return value; InvalidArgument if it is not JSON or too large."""
    try:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(
            f"the task returned a {type(value).__name__}, which is not JSON ({exc}); return None or a JSON value "
            "(dict, list, str, number, bool)"
        ) from exc
    size = len(text.encode())
    if size > limit:
        raise InvalidArgument(
            f"the task's result takes {size:,} bytes of JSON, more than the limit of {limit:,}; store large data "
            "elsewhere and return its id"
        )
    return text


@dataclass(frozen=True)
class Finished:
    """Where a waited-for job ended: its status, its result's JSON and its error (None: no such job)."""

    job_id: int
    status: str | None
    result_json: str | None
    error: str | None

    def value(self) -> Any:
        """The job's decoded result; JobFailed if it died or was cancelled, JobNotFound if it is gone."""
        if self.status is None:
            raise JobNotFound(f"there is no job {self.job_id} (it may have been purged)")
        if self.status != SUCCEEDED:
            first = (self.error or "").split("\n", 1)[0]
            raise JobFailed(
                f"job {self.job_id} is {self.status}, it has no result" + (f": {first}" if first else ""),
                job_id=self.job_id,
                status=self.status,
                error=self.error,
            )
        return None if self.result_json is None else json.loads(self.result_json)


Deliver = Callable[[Finished], None]


class ResultWaiter:
    """Every pending wait for a job's result on one engine, served by one thread with one query per round.

    Args:
        engine: The database of the jobs.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._waits: dict[int, list[Deliver]] = {}
        self._thread: threading.Thread | None = None
        self._new = threading.Event()

    def wait(self, job_id: int, timeout: float | None) -> Finished:
        """Block until the job finished (or is gone); ResultTimeout after ``timeout`` seconds."""
        done = threading.Event()
        found: list[Finished] = []

        def deliver(finished: Finished) -> None:
            found.append(finished)
            done.set()

        self._add(job_id, deliver)
        if not done.wait(timeout):
            self._drop(job_id, deliver)
            if not found:
                raise _timed_out(job_id, timeout)
        return found[0]

    async def await_finished(self, job_id: int, timeout: float | None) -> Finished:
        """Wait on the running loop until the job finished (or is gone); ResultTimeout after ``timeout``."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Finished] = loop.create_future()

        def settle(finished: Finished) -> None:
            if not future.done():
                future.set_result(finished)

        def deliver(finished: Finished) -> None:
            loop.call_soon_threadsafe(settle, finished)

        self._add(job_id, deliver)
        try:
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            raise _timed_out(job_id, timeout) from None
        finally:
            self._drop(job_id, deliver)

    def _add(self, job_id: int, deliver: Deliver) -> None:
        with self._lock:
            self._waits.setdefault(job_id, []).append(deliver)
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="dibs-results", daemon=True)
                self._thread.start()
        self._new.set()

    def _drop(self, job_id: int, deliver: Deliver) -> None:
        with self._lock:
            waiting = self._waits.get(job_id)
            if waiting is not None and deliver in waiting:
                waiting.remove(deliver)
                if not waiting:
                    del self._waits[job_id]

    def _serve(self) -> None:
        pause = FIRST_POLL
        while True:
            with self._lock:
                ids = list(self._waits)
                if not ids:
                    self._thread = None
                    return
            self._new.clear()
            try:
                finished = self._look(ids)
            except Exception:  # the database is away for now: the waits go on until it answers or time out
                finished = []
            for outcome in finished:
                with self._lock:
                    delivers = self._waits.pop(outcome.job_id, [])
                for deliver in delivers:
                    deliver(outcome)
            # A new wait, or a job that just finished, starts the backoff again: others may follow soon.
            woken = self._new.wait(pause)
            pause = FIRST_POLL if woken or finished else min(pause * 2, LONGEST_POLL)

    def _look(self, ids: Sequence[int]) -> list[Finished]:
        """The jobs of ``ids`` that finished, or are gone: one query per chunk of ids."""
        found: list[Finished] = []
        columns = (jobs.c.id, jobs.c.status, jobs.c.result, jobs.c.last_error)
        with connected(self.engine) as conn:
            for start in range(0, len(ids), _CHUNK):
                chunk = ids[start : start + _CHUNK]
                rows = {row[0]: row for row in conn.execute(sa.select(*columns).where(jobs.c.id.in_(chunk)))}
                for job_id in chunk:
                    row = rows.get(job_id)
                    if row is None:
                        found.append(Finished(job_id, None, None, None))
                    elif row[1] in FINISHED:
                        found.append(Finished(job_id, row[1], row[2], row[3]))
        return found


def _timed_out(job_id: int, timeout: float | None) -> ResultTimeout:
    return ResultTimeout(
        f"job {job_id} had not finished after {timeout:g} seconds; it was left as it is: wait again, or cancel it"
    )
