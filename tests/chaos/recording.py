"""A queue worker that writes its history: the job store's claims and fenced writes, and the task functions'
starts and finishes, as :class:`tests.chaos.history.Recorder` events, for the infrastructure scenarios.

:class:`RecordingStore` stands in for an App's JobStore (``recording_app`` puts it in place); the tasks of
:func:`register_tasks` record ``started``/``finished`` with the token of the claim they run under.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

import dibs
from dibs.lease import Lease
from dibs.queue.store import JobStore
from dibs.schema import DEAD
from tests.chaos.history import Recorder, epoch

#: Task names of the scenarios' workload.
WORK = "chaos.work"
KEYED = "chaos.keyed"


def _job(lease: Lease) -> int:
    return int(lease.key[0])


class RecordingStore(JobStore):
    """The queue's statements, each claim and lease write recorded with its outcome (``changed`` None when
    the write raised: it may or may not have committed)."""

    def __init__(self, engine: Engine, recorder: Recorder) -> None:
        super().__init__(engine)
        self.recorder = recorder
        self._tokens: dict[int, int] = {}
        self._lock = threading.Lock()

    def token_of(self, job_id: int) -> int | None:
        """The token of this process's latest claim of the job."""
        with self._lock:
            return self._tokens.get(job_id)

    def claim(self, conn: Engine | Connection, **options: Any) -> list[Lease]:
        claimed = super().claim(conn, **options)
        for lease in claimed:
            with self._lock:
                self._tokens[_job(lease)] = lease.token
            self.recorder.record(
                "claimed",
                _job(lease),
                token=lease.token,
                expires_at=epoch(lease.expires_at),
                attempt=lease.row._mapping["attempts"],
            )
        return claimed

    def renew(self, conn: Engine | Connection, held: Sequence[Lease], lease_seconds: float) -> list[Lease]:
        began = time.time()
        lost = super().renew(conn, held, lease_seconds)
        lost_ones = {(lease.key, lease.token) for lease in lost}
        for lease in held:
            if (lease.key, lease.token) not in lost_ones:
                self.recorder.record("renewed", _job(lease), token=lease.token, expires_at=began + lease_seconds)
        return lost

    def _written(self, kind: str, held: Sequence[Lease], status: str | None, write: Any) -> list[Lease]:
        """Run a lease write returning the lost leases; record each lease's outcome."""
        try:
            lost: list[Lease] = write()
        except BaseException:
            for lease in held:
                self.recorder.record(kind, _job(lease), token=lease.token, status=status, changed=None)
            raise
        # By key and token: a batch may hold a stale lease and the newer one of the same job.
        lost_ones = {(lease.key, lease.token) for lease in lost}
        for lease in held:
            changed = (lease.key, lease.token) not in lost_ones
            self.recorder.record(kind, _job(lease), token=lease.token, status=status, changed=changed)
        return lost

    def succeed(
        self, conn: Engine | Connection, held: Sequence[Lease], results: Sequence[tuple[Lease, str]] = ()
    ) -> list[Lease]:
        def write() -> list[Lease]:
            return super(RecordingStore, self).succeed(conn, held, results)

        return self._written("completed", held, "succeeded", write)

    def succeed_in(self, conn: Connection, lease: Lease, result: str | None) -> bool:
        # Recorded before the transaction commits, so a kept completion is "changed: None" (it commits
        # only if the process lives on); a refused one changed nothing.
        kept = super().succeed_in(conn, lease, result)
        self.recorder.record(
            "completed", _job(lease), token=lease.token, status="succeeded", changed=None if kept else False
        )
        return kept

    def retry(self, conn: Engine | Connection, lease: Lease, delay: timedelta, error: str) -> bool:
        def write() -> list[Lease]:
            return [] if super(RecordingStore, self).retry(conn, lease, delay, error) else [lease]

        return not self._written("completed", [lease], "scheduled", write)

    def bury(self, conn: Engine | Connection, lease: Lease, error: str, status: str = DEAD) -> bool:
        def write() -> list[Lease]:
            return [] if super(RecordingStore, self).bury(conn, lease, error, status) else [lease]

        return not self._written("completed", [lease], status, write)

    def release(self, conn: Engine | Connection, held: Sequence[Lease]) -> list[Lease]:
        return self._written("released", held, "released", lambda: super(RecordingStore, self).release(conn, held))


def recording_app(engine: Engine, recorder: Recorder, *, notify: bool = True) -> dibs.App:
    """An App on ``engine`` whose store records, with the scenarios' tasks registered."""
    app = dibs.App(engine, notify=notify)
    store = RecordingStore(engine, recorder)
    app._store = store
    register_tasks(app, store, recorder)
    return app


def register_tasks(app: dibs.App, store: RecordingStore, recorder: Recorder) -> None:
    """``chaos.work(n, seconds)`` and ``chaos.keyed(account, n, seconds)`` (one at a time per account, in
    enqueue order): each records its start and finish, and naps ``seconds``."""

    def ran(context: dibs.JobContext, seconds: float) -> None:
        token = store.token_of(context.job_id)
        recorder.record("started", context.job_id, token=token, attempt=context.attempt)
        try:
            time.sleep(seconds)
        except BaseException:
            recorder.record("finished", context.job_id, token=token, outcome="raised")
            raise
        recorder.record("finished", context.job_id, token=token, outcome="returned")

    @app.task(name=WORK, max_attempts=20)
    def work(n: int, seconds: float, context: dibs.JobContext) -> None:
        ran(context, seconds)

    @app.task(name=KEYED, ordering_key="account", max_attempts=20)
    def keyed(account: str, n: int, seconds: float, context: dibs.JobContext) -> None:
        ran(context, seconds)


def workload(plain: int, keyed: int, accounts: int, seconds: float) -> list[tuple[str, dict[str, Any]]]:
    """(task, args) of the scenarios' jobs: ``plain`` independent ones, then ``keyed`` ones spread over
    ``accounts`` ordering keys, interleaved (so that keyed jobs wait behind each other)."""
    jobs: list[tuple[str, dict[str, Any]]] = [(WORK, {"n": n, "seconds": seconds}) for n in range(plain)]
    jobs += [(KEYED, {"account": f"acct-{n % accounts}", "n": n, "seconds": seconds}) for n in range(keyed)]
    return jobs


def enqueue(app: dibs.App, jobs: Sequence[tuple[str, dict[str, Any]]], per_call: int = 500) -> list[int]:
    """Enqueue the jobs in order, each task's in bulk; their ids, in enqueue order."""
    ids: list[int] = []
    for task in dict.fromkeys(name for name, _ in jobs):
        args = [each for name, each in jobs if name == task]
        for start in range(0, len(args), per_call):
            ids += [job.id for job in app.enqueue_many(task, args[start : start + per_call])]
    return ids


def count_completions(directory: Any) -> int:
    """Completions recorded so far (any outcome), read from the history files without a database."""
    from pathlib import Path

    total = 0
    for path in Path(directory).glob("*.jsonl"):
        total += path.read_bytes().count(b'"kind":"completed"')
    return total


def terminal_count(engine: Engine) -> int:
    """Jobs in a final state."""
    from dibs.schema import jobs

    with engine.connect() as conn:
        query = (
            sa.select(sa.func.count()).select_from(jobs).where(jobs.c.status.in_(["succeeded", "dead", "cancelled"]))
        )
        return int(conn.execute(query).scalar_one())
