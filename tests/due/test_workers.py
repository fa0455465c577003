"""Many workers at once: each source taken by one of them at a time, once per due period; a killed worker's
source held until its lease expires, then taken again; a stale lease changes nothing; a long handler keeps
its lease."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import dibs
from tests.due.sources import Sources
from tests.due.support import HOUR, Run, RunLog, aware, database_now, storable
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]

Spawn = Callable[..., "subprocess.Popen[bytes]"]


@pytest.fixture
def spawn(sources: Sources, tmp_path: Path) -> Iterator[Spawn]:
    """Start worker processes (tests.due.worker_process) on the test's database; all killed at the end."""
    started: list[subprocess.Popen[bytes]] = []
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}

    def start(name: str, *options: str) -> subprocess.Popen[bytes]:
        command = [
            sys.executable,
            "-m",
            "tests.due.worker_process",
            sources.url.render_as_string(hide_password=False),
            "--log",
            str(tmp_path / f"{name}.jsonl"),
            "--result",
            str(tmp_path / f"{name}.result.json"),
            "--owner",
            name,
            *options,
        ]
        with (tmp_path / f"{name}.out").open("wb") as output:
            process = subprocess.Popen(command, cwd=ROOT, env=environment, stdout=output, stderr=subprocess.STDOUT)
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def test_worker_processes_take_each_source_exactly_once(sources: Sources, spawn: Spawn, tmp_path: Path) -> None:
    sources.add(*[{"id": n, "priority": n % 3} for n in range(1, 201)])
    names = [f"worker-{n}" for n in range(3)]
    go = tmp_path / "go"
    processes = [
        spawn(name, "--ready", str(tmp_path / f"{name}.ready"), "--go", str(go), "--concurrency", "2") for name in names
    ]
    wait_until(
        lambda: (
            all((tmp_path / f"{name}.ready").exists() for name in names)
            or any(process.poll() is not None for process in processes)
        ),
        timeout=30,
        what="the workers to start",
    )
    go.touch()  # all at once
    for name, process in zip(names, processes, strict=True):
        try:
            code = process.wait(30)
        except subprocess.TimeoutExpired:
            code = None
        assert code == 0, f"{name} ended with {code}: {(tmp_path / f'{name}.out').read_text()}"

    runs = RunLog.read(*(tmp_path / f"{name}.jsonl" for name in names)).by_source()
    assert sorted(runs) == list(range(1, 201)), "a source was not handled"
    twice = {source: found for source, found in runs.items() if len(found) != 1}
    assert twice == {}, "a source was handled more than once"
    assert {found[0].token for found in runs.values()} == {1}
    workers = {found[0].worker for found in runs.values()}
    assert len(workers) >= 2, "the workers did not run at the same time"

    results = [json.loads((tmp_path / f"{name}.result.json").read_text()) for name in names]
    assert sum(result["claimed"] for result in results) == 200
    assert sum(result["succeeded"] for result in results) == 200
    assert sum(result["failed"] + result["lost"] for result in results) == 0

    rows = sources.rows()
    assert {(row.lease_status, row.run_count, row.lease_token) for row in rows.values()} == {("idle", 1, 1)}
    assert all(row.last_run_at is not None and row.last_error is None for row in rows.values())
    assert sources.scheduler(interval=HOUR).claim(sources.engine, owner="late", limit=500) == []


def test_threads_take_each_source_once_per_due_period_never_two_at_a_time(sources: Sources) -> None:
    interval = 0.6
    sources.add(*[{"id": n} for n in range(1, 13)])
    log = RunLog()
    stop = threading.Event()
    errors: list[BaseException] = []

    def work(name: str) -> None:
        engine = sources.new_engine()
        scheduler = sources.scheduler(interval=interval, lease=10)

        def handler(row: Any) -> None:
            start = time.time()
            time.sleep(0.03)
            log.add(Run(row.id, name, row.lease_token, start, time.time()))

        try:
            while not stop.is_set():
                stats = scheduler.run(engine, handler, max_sources=4, concurrency=2, owner=name)
                if stats.claimed == 0:
                    stop.wait(0.02)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(f"thread-{n}",), daemon=True) for n in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(1.5)  # the first round, and one or two more an interval apart
    stop.set()
    for thread in threads:
        thread.join(15)
    assert not any(thread.is_alive() for thread in threads), "a worker thread did not stop"
    assert errors == []

    runs = log.by_source()
    assert sorted(runs) == list(range(1, 13))
    rows = sources.rows()
    for source, found in runs.items():
        assert len(found) >= 2, f"source {source} ran once only in 1.5 s with an interval of 0.6 s"
        assert [run.token for run in found] == list(range(1, len(found) + 1))
        assert (rows[source].run_count, rows[source].lease_token) == (len(found), len(found))
        for before, after in itertools.pairwise(found):
            # Due again one interval after the run ended (done() stamps its end), not before.
            assert after.start >= before.end + interval - 0.02, f"source {source} ran again too soon: {found}"
    assert len({run.worker for run in log.runs}) >= 2


def test_a_killed_workers_source_waits_out_its_lease_then_is_taken_again(sources: Sources, spawn: Spawn) -> None:
    sources.add({"id": 1, "priority": 10}, {"id": 2, "priority": 0})
    process = spawn("victim", "--block", "--lease", "1.5", "--max-sources", "1", "--concurrency", "1")
    log = Path(process.args[process.args.index("--log") + 1])
    wait_until(
        lambda: (log.exists() and log.read_text().strip()) or process.poll() is not None,
        timeout=30,
        what="the victim to start its handler",
    )
    assert process.poll() is None, f"the victim ended: {log.with_suffix('').with_suffix('.out').read_text()}"
    (started,) = RunLog.read(log).runs
    assert (started.id, started.token) == (1, 1)
    held = sources.row(1)
    assert (held.lease_status, held.lease_owner, held.lease_token, held.run_count) == ("running", "victim", 1, 1)

    other = sources.scheduler(interval=HOUR, priority="priority", lease=30)
    taken = other.claim(sources.engine, owner="other", limit=10)
    assert [lease.key for lease in taken] == [(2,)], "the victim's source was taken while its lease was held"
    assert other.complete(sources.engine, taken) == []

    process.send_signal(signal.SIGKILL)
    assert process.wait(10) == -signal.SIGKILL
    expires = aware(sources.row(1).lease_expires_at)
    assert expires is not None
    assert database_now(sources.engine) < expires  # renewed every half second, for 1.5 s
    assert other.claim(sources.engine, owner="other", limit=10) == []

    (lease,) = wait_until(
        lambda: other.claim(sources.engine, owner="other", limit=10), timeout=5, interval=0.05, what="the reclaim"
    )
    assert database_now(sources.engine) >= expires
    assert (lease.key, lease.token, lease.owner) == ((1,), 2, "other")
    assert (lease.row.run_count, lease.row.last_run_at) == (2, None)  # the dead worker never finished it
    assert other.complete(sources.engine, [lease]) == []
    row = sources.row(1)
    assert (row.lease_status, row.lease_token) == ("idle", 2)
    assert row.last_run_at is not None


def test_a_stale_lease_changes_nothing_and_is_reported_lost(sources: Sources) -> None:
    sources.add({"id": 1})
    first = sources.scheduler(interval=HOUR, lease=0.3)
    second = sources.scheduler(interval=HOUR, lease=30)
    (stale,) = first.claim(sources.engine, owner="a", limit=1)
    assert second.claim(sources.engine, owner="b", limit=1) == []  # held
    (current,) = wait_until(
        lambda: second.claim(sources.engine, owner="b", limit=1), timeout=5, interval=0.05, what="the expiry"
    )
    assert current.key == stale.key
    assert current.token == stale.token + 1

    # The first owner comes back: every write it tries is refused, and the row stays the second's.
    assert first.complete(sources.engine, [stale]) == [stale]
    assert first.fail(sources.engine, [stale], "RuntimeError: stale") == [stale]
    assert first.release(sources.engine, [stale]) == [stale]
    row = sources.row(1)
    assert (row.lease_status, row.lease_owner, row.lease_token, row.run_count) == ("running", "b", current.token, 2)
    assert (row.last_run_at, row.last_error) == (None, None)

    assert second.complete(sources.engine, [current]) == []
    assert second.complete(sources.engine, [current]) == [current]  # finished already
    row = sources.row(1)
    assert (row.lease_status, row.lease_token) == ("idle", current.token)
    assert row.last_run_at is not None


def test_a_long_handler_keeps_its_lease(sources: Sources) -> None:
    sources.add({"id": 1})
    scheduler = sources.scheduler(interval=HOUR, lease=1.0)
    thief = sources.scheduler(interval=HOUR, lease=30)
    thief_engine = sources.new_engine()
    running, finished = threading.Event(), threading.Event()
    stolen: list[dibs.Lease] = []
    expiries: list[Any] = []

    def handler(row: Any) -> None:
        running.set()
        time.sleep(2.5)

    def steal() -> None:
        running.wait(10)
        while not finished.is_set():
            stolen.extend(thief.claim(thief_engine, owner="thief", limit=10))
            expires = aware(sources.row(1).lease_expires_at)
            if expires is not None:  # None once the run is done
                expiries.append(expires)
            finished.wait(0.1)

    stealer = threading.Thread(target=steal, daemon=True)
    stealer.start()
    try:
        stats = scheduler.run(sources.engine, handler, max_sources=10)
    finally:
        finished.set()
        stealer.join(10)
    assert stolen == [], "another worker took the source while its handler ran"
    assert len(expiries) >= 10
    assert max(expiries) - min(expiries) >= timedelta(seconds=1.2), "the lease was not renewed"
    assert (stats.claimed, stats.succeeded, stats.failed, stats.lost) == (1, 1, 0, 0)
    row = sources.row(1)
    assert (row.lease_status, row.lease_token, row.run_count) == ("idle", 1, 1)
    assert row.last_run_at is not None


def test_a_handler_whose_lease_was_taken_over_is_counted_lost(sources: Sources) -> None:
    sources.add({"id": 1})
    scheduler = sources.scheduler(interval=HOUR, lease=30)
    thief = sources.scheduler(interval=HOUR, lease=30)
    taken: list[dibs.Lease] = []

    def handler(row: Any) -> None:
        # As if the handler had overrun its lease: it expires, and another worker takes the source.
        expired = database_now(sources.engine) - timedelta(seconds=1)
        sources.update(1, lease_expires_at=storable(sources.engine, expired))
        taken.extend(thief.claim(sources.engine, owner="thief", limit=1))

    stats = scheduler.run(sources.engine, handler, max_sources=10)
    assert [lease.token for lease in taken] == [2]
    assert (stats.claimed, stats.succeeded, stats.failed, stats.lost) == (1, 0, 0, 1)
    row = sources.row(1)
    assert (row.lease_status, row.lease_owner, row.lease_token, row.last_run_at) == ("running", "thief", 2, None)


def test_a_run_finds_due_rows_while_another_workers_claim_is_in_flight(sources: Sources) -> None:
    """Two workers claiming at the same moment both get work while plenty is due: run() must not take "nothing
    due" for an answer (and leave its worker idle) because another worker's claim is in flight. On MariaDB a
    claim whose order no index gives locks every due row it sorts, so the claim itself finds none meanwhile;
    the run loop reads the due rows without locks and claims again."""
    if sources.family == "sqlite":
        pytest.skip("SQLite takes one writer at a time: a second claim waits for the first to commit")
    sources.add(*[{"id": n} for n in range(1, 51)])
    scheduler = sources.scheduler(interval=HOUR)
    other_engine = sources.new_engine()
    handled: list[Any] = []
    results: list[dibs.DueStats] = []
    second = threading.Thread(
        target=lambda: results.append(scheduler.run(other_engine, lambda row: handled.append(row.id), max_sources=1))
    )

    def meanwhile(conn: Any, rows: Any) -> None:
        # The first claim's transaction is still open: a second worker runs now.
        second.start()
        time.sleep(0.3)

    # The scheduler's own claim (its due test and order), with a callback inside its transaction.
    first = scheduler.leases.claim(
        sources.engine,
        owner="a",
        duration=30,
        where=scheduler.due(sources.engine),
        order_by=scheduler.order(),
        limit=1,
        then=meanwhile,
    )
    second.join(30)
    assert len(first) == 1
    (stats,) = results
    assert (stats.claimed, stats.succeeded) == (1, 1), "49 sources were due, yet the second worker ran none"
    assert handled != [first[0].key[0]]
