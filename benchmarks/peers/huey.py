"""huey on SQLite (``SqliteHuey``), run by its own consumer, in the configuration its docs give for throughput.

Each worker process builds a ``SqliteHuey`` on a file of its own next to the dibs file and runs huey's
consumer (``huey.consumer.Consumer``, what ``huey_consumer.py`` runs) with thread workers, the worker type
its docs advise for anything neither CPU-heavy nor IO-heavy. A huey worker takes one message per
``dequeue()`` (``SqliteStorage.dequeue``: ``ORDER BY priority DESC, id LIMIT 1`` and a delete, in one
``BEGIN EXCLUSIVE`` transaction), so every setting has batch 1; its documented lever for throughput is
``workers``. All the threads of one process share the one SQLite connection of its storage, behind a lock.

The storage keeps huey's defaults, WAL journal, 5 s busy timeout, 8 MB page cache, except ``fsync=False``:
the docs give false as its default and describe ``fsync`` as durable writes that are slower, while the
code's default (None) leaves SQLite at ``synchronous=FULL``, one fsync per commit. ``fsync=False`` sets
``synchronous=OFF``, which is looser than dibs's WAL with ``synchronous=NORMAL``, so the setting favours
huey. The result store stays on with ``store_none=False`` (the defaults): a no-op returns None, so a
success writes no result, while a failure would be stored, which ``verify`` looks for. huey logs every
task at INFO; here only warnings and errors get through (the consumer's ``-q``). No periodic tasks
(``-n``). The polling settings are those of the docs' example for a busy queue (``-b 1.05 -m 1.0``); they
never come into play before the end of a drain, because a worker sleeps only after finding the queue
empty. The ``process`` worker type is not measured: more worker processes are what the benchmark's own
process count gives, each with a connection of its own.

huey's consumer has no burst mode, so the drain runs it with ``start()`` and, once every worker has found
the queue empty (a ``Worker`` subclass that notes it in ``sleep()``, huey's back-off after an empty poll)
and ``pending_count()`` is 0, ``stop(graceful=True)``, which wakes the sleeping workers and waits for them.
huey keeps no record of a finished task (the queue row is deleted on dequeue), so ``verify`` checks what
it can (the queue, the schedule and the result store are empty) and returns no span; that each job ran
exactly once rests on the handler's count, which the benchmark sums, and on the drain checking that each
process ran as many tasks as its workers took.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from benchmarks import payload

NAME = "huey"
BACKENDS = ("sqlite",)
PACKAGES = ("huey",)
#: Worker threads share the process's one SQLite connection, so more than 2 barely help (4 was slower).
SETTINGS = [{"workers": 1, "batch": 1}, {"workers": 2, "batch": 1}]
QUEUE = "dibs_bench"
TASK = "noop"
FILENAME = "huey.sqlite"
#: SqliteStorage.enqueue's statement, for filling the queue in one transaction.
ENQUEUE = "insert into task (queue, data, priority) values (?, ?, ?)"
#: SqliteHuey's options: its defaults (spelled out), but for fsync, as the module docstring explains.
STORAGE = {"journal_mode": "wal", "timeout": 5, "cache_mb": 8, "fsync": False}
#: The consumer's polling, from the docs' example of a consumer with "a very short polling interval".
POLLING = {"initial_delay": 0.1, "backoff": 1.05, "max_delay": 1.0}


def label(setting: dict[str, Any]) -> str:
    return f"w{setting['workers']}"


def parse(text: str) -> list[dict[str, Any]]:
    """``1,2,4``: numbers of consumer worker threads."""
    return [{"workers": int(item), "batch": 1} for item in text.split(",")]


def _huey(filename: str) -> Any:
    from huey import SqliteHuey  # type: ignore[import-untyped]

    return SqliteHuey(QUEUE, results=True, store_none=False, immediate=False, filename=filename, **STORAGE)


class _Idle:
    """Which of a consumer's workers have found the queue empty; ``everyone`` is set once all of them have."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.lock = threading.Lock()
        self.seen: set[int] = set()
        self.everyone = threading.Event()

    def found_empty(self, worker: object) -> None:
        with self.lock:
            self.seen.add(id(worker))
            if len(self.seen) == self.workers:
                self.everyone.set()

    def reset(self) -> None:
        with self.lock:
            self.seen.clear()
            self.everyone.clear()


def _consumer(huey: Any, workers: int, idle: _Idle) -> Any:
    """huey's Consumer, its workers noting when they find the queue empty, as huey_consumer.py would make it
    with ``-w WORKERS -k thread -n -b 1.05 -m 1.0``."""
    from huey.consumer import Consumer, Worker  # type: ignore[import-untyped]

    class DrainWorker(Worker):  # type: ignore[misc]
        def sleep(self) -> None:
            idle.found_empty(self)
            super().sleep()

    class DrainConsumer(Consumer):  # type: ignore[misc]
        worker_class = DrainWorker

    return DrainConsumer(huey, workers=workers, worker_type="thread", periodic=False, **POLLING)


def drain(address: str, setting: dict[str, Any], start: Any) -> tuple[int, float, dict[str, Any]]:
    huey = _huey(address)
    done = 0
    counting = threading.Lock()

    @huey.task(name=TASK)  # type: ignore[untyped-decorator]
    def noop(**_: Any) -> None:
        nonlocal done
        with counting:
            done += 1

    workers = setting["workers"]
    idle = _Idle(workers)
    consumer = _consumer(huey, workers, idle)
    huey.pending_count()  # opens the storage's connection
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    start.wait()
    consumer.start()
    for signum, handler in handlers.items():
        if handler is not None:
            signal.signal(signum, handler)  # the consumer's own handlers are for a consumer that runs alone
    threads = [thread for _, thread in consumer.worker_threads]
    stalled_at = -1
    while True:
        if idle.everyone.wait(timeout=1.0):
            left = huey.pending_count()
            if left == 0:
                break
            # The workers slept after errors (they log them), not on an empty queue: go on while they make
            # progress, stop if they made none since the last time.
            if done == stalled_at:
                consumer.stop(graceful=True)
                raise RuntimeError(f"huey: the workers ran no task since the last check, with {left} queued")
            stalled_at = done
            idle.reset()
        elif not any(thread.is_alive() for thread in threads):
            consumer.stop()
            raise RuntimeError("huey: every consumer worker died before the queue was empty")
    consumer.stop(graceful=True)
    end = time.monotonic()
    taken = sum(worker.task_count for worker, _ in consumer.worker_threads)
    huey.storage.close()
    if taken != done:
        raise RuntimeError(f"huey: the workers took {taken} tasks and the handler ran {done}")
    return done, end, {"taken": taken}


class Database:
    """huey's SQLite file beside the dibs file: emptied and filled before each trial."""

    def __init__(self, backend: str, server_url: str) -> None:
        if backend != "sqlite":
            raise ValueError(f"huey runs on sqlite here, not {backend}")
        database = sa.make_url(server_url).database
        if not database:
            raise ValueError(f"huey needs a SQLite file, not {server_url}")
        self.path = Path(database).with_name(FILENAME)
        self._remove()  # a file left over from an earlier run
        self.huey = _huey(str(self.path))

        @self.huey.task(name=TASK)  # type: ignore[untyped-decorator]
        def noop(**_: Any) -> None:
            return None

        self.noop = noop

    def address(self) -> str:
        return str(self.path)

    def refill(self, jobs: int) -> None:
        self.huey.flush()  # the queue, the schedule, the result store and the counters
        # huey enqueues one message per call, each in a transaction of its own; these are the same rows
        # (huey's serialized messages, SqliteStorage.enqueue's INSERT) written in one transaction.
        rows = [(self.huey.name, self.huey.serialize_task(self.noop.s(**payload.args(n))), 0) for n in range(jobs)]
        with self.huey.storage.db(commit=True) as cursor:
            cursor.executemany(ENQUEUE, rows)
        self.huey.storage.sql("PRAGMA wal_checkpoint(TRUNCATE)")
        self.huey.storage.close()

    def verify(self, jobs: int) -> float:
        queued, scheduled, stored = self.huey.pending_count(), self.huey.scheduled_count(), self.huey.result_count()
        self.huey.storage.close()
        if queued or scheduled or stored:
            raise RuntimeError(
                f"huey: expected {jobs} tasks run and nothing left, found {queued} queued, {scheduled} scheduled "
                f"and {stored} in the result store (failures)"
            )
        return float("nan")

    def close(self) -> None:
        self.huey.storage.close()
        self._remove()

    def _remove(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            self.path.with_name(self.path.name + suffix).unlink(missing_ok=True)
