"""Soak: the job chaos faults, continuously, on a longer workload; then the history check.

    python -m tests.chaos.soak --backend postgresql --minutes 5 [--workers N] [--log-dir DIR] [--keep]

Workers (real processes, tests/chaos/worker_process.py) kill themselves at random points; meanwhile the
soak SIGKILLs workers from outside, stops one past its lease and wakes it later (a zombie), and on the
servers kills every connection of the database, one fault about every second, while it keeps a backlog
of ordinary, async, keyed and slow jobs. At the end it stops injecting, lets every job finish, checks the
whole history (tests/chaos/history.py), prints the summary and exits 1 on any problem.

It works in a database of its own (``dibs_soak_<pid>``, dropped at the end) on the servers the tests use
(DIBS_TEST_POSTGRES_URL, DIBS_TEST_MARIADB_URL), or in an SQLite file.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa

import dibs
from tests.chaos.fleet import Fleet, WorkerProcess, kill_connections
from tests.chaos.worker_process import POINTS
from tests.helpers.targets import MARIADB_URL, POSTGRES_URL, with_driver

DIE_AT = "after-claim:0.02,mid-handler:0.005,before-complete:0.02"
BACKLOG = 300


@contextmanager
def soak_database(backend: str, directory: Path) -> Iterator[sa.URL]:
    """A fresh database with the dibs schema, dropped afterwards."""
    name = f"dibs_soak_{os.getpid()}"
    if backend == "sqlite":
        url = sa.make_url(f"sqlite+pysqlite:///{directory / 'soak.sqlite'}")
        admin = None
    elif backend == "postgresql":
        base = with_driver(POSTGRES_URL, "postgresql+psycopg")
        admin = sa.create_engine(base, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        url = base.set(database=name)
    else:
        base = with_driver(MARIADB_URL, "mysql+pymysql")
        admin = sa.create_engine(base)
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE `{name}`")
        url = base.set(database=name)
    engine = dibs.create_engine(url)
    try:
        dibs.migrate(engine)
    finally:
        engine.dispose()
    try:
        yield url
    finally:
        if admin is not None:
            with admin.connect() as conn:
                if backend == "postgresql":
                    conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                else:
                    conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
            admin.dispose()


class Soak:
    def __init__(self, fleet: Fleet, workers: int, lease: float) -> None:
        self.fleet = fleet
        self.random = random.Random()
        self.workers = workers
        self.lease = lease
        self.injected: Counter[str] = Counter()
        self.stopped: dict[str, tuple[WorkerProcess, float]] = {}
        self.batches = 0

    def top_up(self) -> None:
        """Keep about BACKLOG jobs unfinished: ordinary, async, keyed, and now and then a slow one."""
        left = self.fleet.unfinished()
        if left >= BACKLOG:
            return
        count = BACKLOG - left
        rng, batch = self.random, self.batches
        self.batches += 1
        self.fleet.enqueue("chaos.work", [{"n": n, "ms": rng.randint(5, 60)} for n in range(count // 2)])
        self.fleet.enqueue("chaos.awork", [{"n": n, "ms": rng.randint(5, 60)} for n in range(count // 4)])
        self.fleet.enqueue(
            "chaos.keyed", [{"key": f"b{batch}k{n % 8}", "n": n, "ms": rng.randint(5, 40)} for n in range(count // 4)]
        )
        if batch % 3 == 0:
            self.fleet.enqueue("chaos.slow", [{"seconds": 1.5 * self.lease}])

    def inject(self) -> None:
        """One fault: a kill from outside, a zombie, or (on a server) every connection killed."""
        choices = ["kill", "zombie"] + (["connections"] if self.fleet.family != "sqlite" else [])
        fault = self.random.choice(choices)
        alive = [worker for worker in self.fleet.alive() if worker.actor not in self.stopped]
        if fault == "connections":
            kill_connections(self.fleet)
        elif not alive:
            return
        elif fault == "kill":
            self.fleet.kill(self.random.choice(alive))
        elif len(alive) > 1:  # keep one worker going
            worker = self.random.choice(alive)
            self.fleet.stop(worker)
            self.stopped[worker.actor] = (worker, time.monotonic() + 2.5 * self.lease)
        else:
            return
        self.injected[fault] += 1

    def wake_zombies(self, now: float | None = None) -> None:
        for actor, (worker, when) in list(self.stopped.items()):
            if now is None or now >= when:
                self.fleet.resume(worker)
                del self.stopped[actor]

    def run(self, seconds: float) -> int:
        for number in range(self.workers):
            self.fleet.spawn(f"w{number}", die_at=DIE_AT, concurrency=4, batch=8, lease=self.lease)
        began = time.monotonic()
        end = began + seconds
        next_fault = began + 1.0
        next_report = began + 15
        while time.monotonic() < end:
            try:
                self.top_up()
            except sa.exc.DBAPIError as error:  # its connection was just killed: next round
                print(f"  enqueueing failed, trying again: {str(error).splitlines()[0]}")
            self.fleet.respawn()
            now = time.monotonic()
            self.wake_zombies(now)
            if now >= next_fault:
                self.inject()
                next_fault = now + self.random.uniform(0.5, 1.5)
            if now >= next_report:
                print(f"  {now - began:.0f} s: {len(self.fleet.committed)} jobs, faults {dict(self.injected)}")
                sys.stdout.flush()
                next_report = now + 15
            time.sleep(0.1)
        self.wake_zombies()
        self.fleet.run_until_done(timeout=300)
        # Every row, not only the jobs whose enqueue was acknowledged: one cut off mid-commit may have landed.
        report = self.fleet.check(committed=None)
        events = self.fleet.events()
        inflicted = Counter(
            event.get("point")
            for event in events
            if event.kind == "fault" and event.get("fault") == "killed" and event.get("point") in POINTS
        )
        print(
            f"soak {self.fleet.family}, {seconds / 60:g} min, {self.workers} workers: "
            f"faults injected: {sum(self.injected.values())} from outside {dict(self.injected)}, "
            f"{sum(inflicted.values())} self-inflicted {dict(inflicted)}"
        )
        print(report.summary)
        for problem in report.problems:
            print(f"  {problem}")
        return 0 if report.ok else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("postgresql", "mariadb", "sqlite"), default="postgresql")
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--lease", type=float, default=1.0)
    parser.add_argument("--log-dir", type=Path, default=None, help="where the history goes (default: a temp dir)")
    options = parser.parse_args()
    directory = options.log_dir or Path(tempfile.mkdtemp(prefix="dibs-soak-"))
    directory.mkdir(parents=True, exist_ok=True)
    print(f"soak on {options.backend} for {options.minutes:g} min; history in {directory}")
    with soak_database(options.backend, directory) as url:
        fleet = Fleet(url, directory / "history")
        try:
            status = Soak(fleet, options.workers, options.lease).run(options.minutes * 60)
        finally:
            fleet.close()
    sys.exit(status)


if __name__ == "__main__":
    main()
