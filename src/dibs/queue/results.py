"""Job results: what a task returned, kept as JSON with its job, and one shared waiter per App for those
who wait for it.

A task that returns None stores nothing: its success is written in the worker's batch as before. Any
other value is encoded here (JSON, at most :data:`MAX_RESULT_BYTES`) and written in the same batch, in the
same transaction as the fenced completion.

Many callers may wait for many jobs at once. They do not poll each on their own: :class:`ResultWaiter`
keeps every pending wait of one App and serves them all from one thread, with one query per round for
all the jobs waited for. Where the database sends notifications (PostgreSQL), the worker announces each
batch of finished jobs on :data:`FINISHED_CHANNEL` and the waiter, listening on one connection, looks
when a job it waits for is named; elsewhere, and while that connection is down, it polls with a backoff.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dibs._errors import InvalidArgument, JobFailed, JobNotFound, ResultTimeout
from dibs.dialects import backend_for
from dibs.dialects.backend import Listener
from dibs.dialects.base import inline
from dibs.engine import connected
from dibs.lease import Lease
from dibs.schema import FINISHED, RUNNING, SUCCEEDED, jobs

#: The most bytes of JSON a task's result may take; a larger one fails the job instead.
MAX_RESULT_BYTES = 1_000_000
#: The waiter's first and longest pause between two looks at the jobs waited for, when it polls.
FIRST_POLL, LONGEST_POLL = 0.01, 0.5
#: The waiter's pause between two looks while notifications arrive: only finishes no worker announces (a
#: lease that expired on its last attempt, a purged job) wait this long.
LISTENING_POLL = 5.0
#: How long the waiter's thread, and its listening connection, stay after the last wait ended: a caller
#: that waits for one job after another does not connect and LISTEN for each.
LINGER = 10.0
#: Ids per query of the waiter.
_CHUNK = 1000
#: The channel a worker announces finished jobs on (where the database has notifications).
FINISHED_CHANNEL = "dibs_finished"
#: The longest payload that lists ids: PostgreSQL takes up to 8,000 bytes; a longer list is sent as "",
#: which tells every waiter to look.
_PAYLOAD_LIMIT = 7_900


#: One job's result, where results are not looked up by key (see Backend.keyed_text); fenced by its lease,
#: as the completion that follows it in the same transaction.
RESULT_WRITE = (
    sa.update(jobs)
    .where(
        jobs.c.id == sa.bindparam("dibs_job"),
        jobs.c.lease_token == sa.bindparam("dibs_token"),
        jobs.c.status == inline(RUNNING),
    )
    .values({jobs.c.result: sa.bindparam("dibs_result", type_=jobs.c.result.type)})
)


def finished_payload(ids: Sequence[int]) -> str:
    """The payload announcing that these jobs finished: their ids, or "" (look at every wait) if too many."""
    text = ",".join(map(str, ids))
    return text if len(text) <= _PAYLOAD_LIMIT else ""


def keyed_results(results: Sequence[tuple[Lease, str]]) -> str:
    """The JSON texts of a batch's results as one JSON object by job id (see Backend.keyed_text)."""
    # By token: of two leases of one job in a batch only the newer can hold, so its result wins.
    ordered = sorted(results, key=lambda result: result[0].token)
    return json.dumps({str(lease.key[0]): text for lease, text in ordered})


def announced_ids(payload: str) -> set[int] | None:
    """The job ids a finished-jobs payload names; None when it names none in particular (look at all)."""
    if not payload:
        return None
    try:
        return {int(part) for part in payload.split(",")}
    except ValueError:  # not a payload dibs sent: look, to be safe
        return None


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

    Where the backend has notifications (and ``listen``), one connection LISTENs for announced finished jobs
    and a round runs when one of the jobs waited for is named, with a look every ``listening_poll`` seconds
    besides; otherwise, and while that connection is down, rounds back off from 10 ms to ``poll`` seconds.

    Args:
        engine: The database of the jobs.
        listen: Whether to listen for notifications where the database has them.
        poll: The longest pause between two rounds when polling.
        listening_poll: The pause between two rounds while notifications arrive.
    """

    def __init__(
        self, engine: Engine, *, listen: bool = True, poll: float = LONGEST_POLL, listening_poll: float = LISTENING_POLL
    ) -> None:
        self.engine = engine
        self.listen = listen
        self.poll, self.listening_poll = poll, listening_poll
        self._lock = threading.Lock()
        self._waits: dict[int, list[Deliver]] = {}
        self._thread: threading.Thread | None = None
        self._new = threading.Event()
        self._listener: Listener | None = None

    @property
    def listening(self) -> bool:
        """Whether notifications of finished jobs reach this waiter now."""
        listener = self._listener
        return listener is not None and listener.listening

    def wait(self, job_id: int, timeout: float | None) -> Finished:
        """Block until the job finished (or is gone); ResultTimeout after ``timeout`` seconds."""
        done = threading.Event()
        found: list[Finished] = []

        def deliver(finished: Finished) -> None:
            found.append(finished)
            done.set()

        self._add(job_id, deliver)
        try:
            if not done.wait(timeout) and not found:
                raise _timed_out(job_id, timeout)
        finally:
            self._drop(job_id, deliver)  # a wait cut short by an error (Ctrl-C) too
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
        listener = None
        if self.listen:
            listener = backend_for(self.engine.dialect).listen(self.engine, FINISHED_CHANNEL, self._announced)
        self._listener = listener
        try:
            self._rounds(listener)
        finally:
            if listener is not None:
                listener.close()
            with self._lock:
                if self._listener is listener:  # not yet replaced by the listener of a thread started since
                    self._listener = None

    def _rounds(self, listener: Listener | None) -> None:
        pause = FIRST_POLL
        while True:
            with self._lock:
                ids = list(self._waits)
                if not ids and not self._linger(listener):
                    return
            self._new.clear()
            if not ids:
                continue
            try:
                finished = self._look(ids)
            except Exception:  # the database is away for now: the waits go on until it answers or time out
                finished = []
            for outcome in finished:
                with self._lock:
                    delivers = self._waits.pop(outcome.job_id, [])
                for deliver in delivers:
                    deliver(outcome)
            if listener is not None and listener.listening:
                # Every finish a worker writes is announced: no need to look sooner.
                self._new.wait(self.listening_poll)
                pause = FIRST_POLL
                continue
            # A new wait, or a job that just finished, starts the backoff again: others may follow soon.
            woken = self._new.wait(pause)
            pause = FIRST_POLL if woken or finished else min(pause * 2, self.poll)

    def _linger(self, listener: Listener | None) -> bool:
        """With no wait left (called with the lock held): True if a new one came within LINGER; else the
        thread ends. Only a thread that listens lingers: it keeps its connection for the next wait."""
        if listener is not None:
            deadline = time.monotonic() + LINGER
            while not self._waits and (left := deadline - time.monotonic()) > 0:
                self._lock.release()
                try:
                    # A new wait sets the event after it is added: cleared here, it is seen in the check.
                    self._new.wait(left)
                    self._new.clear()
                finally:
                    self._lock.acquire()
            if self._waits:
                return True
        self._thread = None
        return False

    def _announced(self, payload: str) -> None:
        """From the listener's thread: a round at once if the payload names a job waited for (or none)."""
        named = announced_ids(payload)
        waits = self._waits
        # Lookups, not an iteration over the waits another thread may change meanwhile.
        if named is None or any(job_id in waits for job_id in named):
            self._new.set()

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
