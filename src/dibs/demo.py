"""A demonstration on the embedded SQLite default: worker processes share one table through fenced leases.

Run with ``python -m dibs.demo``. Four worker processes lease batches of tasks, work on them, and
complete or fail them. One worker crashes holding a batch; its leases expire and the others take those
tasks over. At the end the demo checks, from every worker's own record, that no task was
worked on by two workers at once and that none was lost.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import dibs

LEASE_SECONDS = 2.0
BATCH = 20


def tasks_table() -> sa.Table:
    return sa.Table(
        "demo_tasks",
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("result", sa.String(100), nullable=True),
        *dibs.lease_columns(),
    )


def work(url: str, worker: int, crash_after: int | None, log: Path) -> None:
    """Lease, work on and finish tasks until none are left, appending (task, token, outcome) to ``log``."""
    engine = dibs.create_engine(url)
    table = tasks_table()
    leases = dibs.Leases(table)
    rng = random.Random(worker)
    batches = 0
    idle_since = time.monotonic()
    while time.monotonic() - idle_since < LEASE_SECONDS * 2:
        held = leases.claim(engine, owner=f"worker-{worker}", duration=LEASE_SECONDS, limit=BATCH, order_by="id")
        if not held:
            time.sleep(0.05)
            continue
        idle_since = time.monotonic()
        batches += 1
        if crash_after is not None and batches > crash_after:
            os._exit(0)  # a crash mid-batch: no completion, no release; the leases run out
        done: list[dibs.Lease] = []
        failed: list[dibs.Lease] = []
        for lease in held:
            time.sleep(lease.row.size / 100_000)  # the "work"
            (failed if rng.random() < 0.03 else done).append(lease)
        lost = leases.complete_many(engine, done, set={"result": f"thumbnail by worker-{worker}"})
        lost += leases.fail_many(engine, failed, set={"result": "corrupt image"})
        with log.open("a") as record:
            for lease in held:
                outcome = "lost" if lease in lost else "failed" if lease in failed else "done"
                record.write(f"{lease.key[0]} {lease.token} {outcome}\n")
    engine.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dibs.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--db", default="dibs-demo.sqlite", help="SQLite file to create (replaced if present)")
    options = parser.parse_args(argv)

    path = Path(options.db)
    for stale in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        stale.unlink(missing_ok=True)
    url = f"sqlite:///{path}"
    engine = dibs.create_engine(url)
    table = tasks_table()
    table.create(engine)
    rng = random.Random(7)
    with engine.begin() as conn:
        conn.execute(table.insert(), [{"id": i, "size": rng.randint(10, 90)} for i in range(1, options.tasks + 1)])
    print(f"dibs demo: {options.tasks} tasks in {path}, {options.workers} worker processes, leases of {LEASE_SECONDS}s")
    print(f"worker 0 crashes holding its first batch of {BATCH}; those tasks come back when its leases expire\n")

    started = time.monotonic()
    context = multiprocessing.get_context("spawn")
    logs = [Path(f"{path}.worker-{worker}.log") for worker in range(options.workers)]
    for log in logs:
        log.unlink(missing_ok=True)
    workers = [
        context.Process(target=work, args=(url, worker, 0 if worker == 0 else None, logs[worker]))
        for worker in range(options.workers)
    ]
    crashing, *others = workers
    crashing.start()
    crashing.join()
    for process in others:
        process.start()
    while any(process.is_alive() for process in workers):
        _progress(engine, table, options.tasks, time.monotonic() - started)
        time.sleep(0.2)
    _progress(engine, table, options.tasks, time.monotonic() - started)
    records = []
    for log in logs:
        if log.exists():
            for line in log.read_text().splitlines():
                task, token, outcome = line.split()
                records.append((int(task), int(token), outcome))
            log.unlink()
    print()
    return _summary(engine, table, records, options.tasks, time.monotonic() - started)


def _progress(engine: sa.Engine, table: sa.Table, total: int, elapsed: float) -> None:
    with engine.connect() as conn:
        query = sa.select(table.c.status, sa.func.count()).group_by(table.c.status)
        counts: dict[Any, int] = dict(conn.execute(query).all())
    finished = counts.get("done", 0) + counts.get("failed", 0)
    bar = "#" * (40 * finished // total)
    print(
        f"\r[{bar:<40}] {finished}/{total}  running {counts.get('running', 0):>3}  "
        f"failed {counts.get('failed', 0):>3}  {elapsed:5.1f}s",
        end="",
        flush=True,
    )


def _summary(
    engine: sa.Engine, table: sa.Table, records: list[tuple[int, int, str]], total: int, elapsed: float
) -> int:
    with engine.connect() as conn:
        rows = list(conn.execute(sa.select(table.c.id, table.c.status, table.c.attempts)))
    statuses = Counter(row.status for row in rows)
    retried = sum(1 for row in rows if row.attempts > 1)
    finished_per_task = Counter(task for task, _, outcome in records if outcome != "lost")
    twice = [task for task, times in finished_per_task.items() if times > 1]
    unfinished = [row.id for row in rows if row.status not in ("done", "failed")]
    print(f"\nIn {elapsed:.1f}s: {statuses['done']} tasks done, {statuses['failed']} failed (kept, with their error).")
    print(f"{retried} tasks were held by the crashed worker and finished by another after its leases expired.")
    print(f"Tasks finished by two workers: {len(twice)}.  Tasks lost: {len(unfinished)}.")
    ok = not twice and not unfinished and sum(statuses.values()) == total
    print("Every task was finished exactly once." if ok else "SOMETHING WENT WRONG: see the counts above.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
