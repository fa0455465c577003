"""Worker processes for the job chaos scenarios: spawned, killed, stopped, resumed, respawned, each fault
written down in the history (as actor ``harness``) before it is inflicted.

A :class:`Fleet` runs ``python -m tests.chaos.worker_process`` in *slots*; each incarnation of a slot is an
actor of its own (``w1.0``, ``w1.1``, ...), with its own history file. The tests use it through the
``fleet`` fixture of each test module (see :func:`fleet_for`).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import dibs
from tests.chaos.history import Event, Recorder, Report, check_jobs, load, read_jobs
from tests.chaos.worker_process import Dice, build_app
from tests.helpers import wait_until
from tests.queue.support import family_of, kill_other_sessions

ROOT = Path(__file__).resolve().parents[2]
TERMINAL = ("succeeded", "dead", "cancelled")


@dataclass
class WorkerProcess:
    slot: str
    actor: str
    process: subprocess.Popen[bytes]
    options: dict[str, Any]
    #: Not to be respawned when it ends (it was asked to stop for good).
    retired: bool = False

    @property
    def alive(self) -> bool:
        return self.process.poll() is None


@dataclass
class Fleet:
    """The workers of one scenario, the history they and the harness write, and the database."""

    url: sa.URL
    log_dir: Path
    family: str = field(init=False)
    engine: sa.Engine = field(init=False)
    recorder: Recorder = field(init=False)
    app: dibs.App = field(init=False)
    workers: dict[str, WorkerProcess] = field(default_factory=dict)
    committed: list[int] = field(default_factory=list)
    incarnations: dict[str, int] = field(default_factory=dict)
    faults: int = 0

    def __post_init__(self) -> None:
        self.family = family_of(self.url)
        self.engine = dibs.create_engine(self.url, pool_pre_ping=True)
        self.recorder = Recorder(self.log_dir, "harness")
        # The app the test enqueues with: the same task names as the workers', never run here.
        self.app, _ = build_app(self.url.render_as_string(hide_password=False), self.recorder, Dice("", 0))

    # -- jobs --------------------------------------------------------------------------------------

    def enqueue(self, task: str, many: list[dict[str, Any]], **options: Any) -> list[int]:
        ids = [job.id for job in self.app.enqueue_many(task, many, **options)]
        self.committed.extend(ids)
        return ids

    def rows(self) -> list[dict[str, Any]]:
        return read_jobs(self.engine)

    def unfinished(self) -> int:
        from dibs.schema import jobs

        query = sa.select(sa.func.count()).select_from(jobs).where(jobs.c.status.not_in(TERMINAL))
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

    # -- processes ---------------------------------------------------------------------------------

    def spawn(self, slot: str, **options: Any) -> WorkerProcess:
        """Start a worker in ``slot`` (options: die_at, concurrency, batch, lease, grace, seed)."""
        number = self.incarnations.get(slot, -1) + 1
        self.incarnations[slot] = number
        actor = f"{slot}.{number}"
        command = [
            sys.executable,
            "-m",
            "tests.chaos.worker_process",
            self.url.render_as_string(hide_password=False),
            "--log-dir",
            str(self.log_dir),
            "--actor",
            actor,
        ]
        for name, value in options.items():
            command += [f"--{name.replace('_', '-')}", str(value)]
        if "seed" not in options:
            command += ["--seed", str(random.randrange(1 << 30))]
        output = (self.log_dir / f"{actor}.out").open("wb")
        process = subprocess.Popen(command, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT)
        output.close()
        worker = WorkerProcess(slot, actor, process, options)
        self.workers[slot] = worker
        return worker

    def _signal(self, worker: WorkerProcess, fault: str, signum: int, **fields: Any) -> None:
        self.recorder.fault(fault, worker.actor, pid=worker.process.pid, **fields)
        self.faults += 1
        if worker.alive:
            os.kill(worker.process.pid, signum)

    def kill(self, worker: WorkerProcess) -> None:
        """SIGKILL a worker (the history records it first)."""
        self._signal(worker, "killed", signal.SIGKILL, point="external")
        worker.process.wait(30)

    def stop(self, worker: WorkerProcess) -> None:
        """SIGSTOP: the worker freezes, a zombie holding leases it no longer renews."""
        self._signal(worker, "stopped", signal.SIGSTOP)

    def resume(self, worker: WorkerProcess) -> None:
        self._signal(worker, "resumed", signal.SIGCONT)

    def terminate(self, worker: WorkerProcess) -> None:
        """SIGTERM: the worker stops gracefully; it is not respawned."""
        worker.retired = True
        self._signal(worker, "terminated", signal.SIGTERM)

    def respawn(self) -> int:
        """Start a new incarnation in every slot whose worker died; returns how many."""
        dead = [worker for worker in self.workers.values() if not worker.alive and not worker.retired]
        for worker in dead:
            self.spawn(worker.slot, **worker.options)
        return len(dead)

    def alive(self) -> list[WorkerProcess]:
        return [worker for worker in self.workers.values() if worker.alive]

    def run_until_done(
        self,
        timeout: float = 90.0,
        *,
        chaos: Callable[[Fleet], None] | None = None,
        chaos_every: float = 0.5,
        chaos_until: int | None = None,
    ) -> None:
        """Respawn dead workers until every job is terminal, calling ``chaos(fleet)`` every ``chaos_every``
        seconds meanwhile (while ``self.faults`` < ``chaos_until``, if given); fail loudly after ``timeout``."""
        deadline = time.monotonic() + timeout
        next_chaos = time.monotonic()
        while True:
            self.respawn()
            left = self.unfinished()
            if not left:
                return
            if time.monotonic() > deadline:
                states = sorted({(row["id"], row["status"]) for row in self.rows() if row["status"] not in TERMINAL})
                raise AssertionError(
                    f"{left} jobs still unfinished after {timeout} s (a hang?): {states[:20]}; "
                    f"workers: {[(w.actor, w.process.poll()) for w in self.workers.values()]}; logs in {self.log_dir}"
                )
            if chaos is not None and time.monotonic() >= next_chaos:
                if chaos_until is None or self.faults < chaos_until:
                    chaos(self)
                next_chaos = time.monotonic() + chaos_every
            time.sleep(0.1)

    def wait_for(self, condition: Callable[[], Any], timeout: float = 30.0, what: str = "") -> Any:
        return wait_until(condition, timeout, 0.05, what=f"{what}; logs in {self.log_dir}")

    def events(self) -> list[Event]:
        return load(self.log_dir)

    def close_workers(self, timeout: float = 30.0) -> None:
        """Stop every worker gracefully (SIGTERM; a stopped one is resumed first), SIGKILL any that hangs."""
        for worker in self.workers.values():
            if worker.alive:
                worker.retired = True
                os.kill(worker.process.pid, signal.SIGCONT)
                os.kill(worker.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        hung = []
        for worker in self.workers.values():
            try:
                worker.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                hung.append(worker.actor)
                worker.process.kill()
                worker.process.wait(10)
        if hung:
            raise AssertionError(f"workers {hung} did not stop within {timeout} s of SIGTERM; logs in {self.log_dir}")

    def check(self, **options: Any) -> Report:
        """Stop the workers, then check the whole history against the final rows."""
        self.close_workers()
        options.setdefault("committed", self.committed)
        report = check_jobs(self.events(), self.rows(), **options)
        print(f"[{self.family}] {report.summary}")
        return report

    def close(self) -> None:
        for worker in self.workers.values():
            if worker.alive:
                worker.process.kill()
                worker.process.wait(10)
        self.recorder.close()
        self.app.engine.dispose()
        self.engine.dispose()


def kill_connections(fleet: Fleet) -> int:
    """Kill every other session on the test's database from the server side, as a recorded fault; returns
    how many."""
    killed = kill_other_sessions(fleet.url)
    fleet.recorder.fault("connections-killed", "*", sessions=killed)
    fleet.faults += 1
    return killed


def fleet_for(url: sa.URL, tmp_path: Path) -> Iterator[Fleet]:
    """The body of a ``fleet`` fixture: worker processes on a fresh queue schema of one backend, from the
    ``queue_url`` fixture of the suite's fixtures plugin (tests/helpers/fixtures.py)."""
    running = Fleet(url, tmp_path / "history")
    try:
        yield running
    finally:
        running.close()
