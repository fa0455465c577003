"""Transactional tasks under workers SIGKILLed at the worst moments and zombies SIGSTOPped past their lease
then woken: a counter each job increments in its transaction ends equal to the number of jobs, and each
job's own line is written once, however often the job ran."""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

import dibs
from tests.chaos.fleet import Fleet, fleet_for
from tests.queue.support import counters, runs, test_metadata

#: Self-inflicted kills: after a claim, half way through a job, and just before the fenced completion in
#: the job's transaction (its writes made).
DIE_AT = "after-claim:0.03,mid-handler:0.03,before-complete:0.03"
LEASE = 1.0


@pytest.fixture
def fleet(queue_url: sa.URL, tmp_path: Path) -> Iterator[Fleet]:
    engine = dibs.create_engine(queue_url)
    try:
        test_metadata.create_all(engine)
        with engine.begin() as conn:
            conn.execute(counters.insert().values(name="chaos", n=0))
    finally:
        engine.dispose()
    yield from fleet_for(queue_url, tmp_path)


def running_jobs(fleet: Fleet) -> dict[str, int]:
    """How many jobs each worker has started and not finished, by its history."""
    running: Counter[str] = Counter()
    for event in fleet.events():
        if event.kind in ("started", "finished") and event.actor is not None:
            running[event.actor] += 1 if event.kind == "started" else -1
    return running


def kill_or_freeze(fleet: Fleet) -> None:
    """Every third fault SIGKILLs a worker; the others make a zombie of a worker running jobs: SIGSTOPped
    past its lease (its jobs are recovered and run again elsewhere, while its transactions stay open), then
    SIGCONTed, so that it comes back to complete jobs that are no longer its own."""
    alive = fleet.alive()
    if not alive:
        return
    if fleet.faults % 3 == 0:
        fleet.kill(random.choice(alive))
        return
    running = running_jobs(fleet)
    busy = [worker for worker in alive if running[worker.actor] > 0]
    if not busy:
        return  # no worker is running a job right now: try again at the next round
    worker = random.choice(busy)
    fleet.stop(worker)
    time.sleep(LEASE * 3)
    fleet.resume(worker)


def test_a_counter_incremented_in_each_jobs_transaction_equals_the_jobs_despite_kills_and_zombies(
    fleet: Fleet,
) -> None:
    rng = random.Random()
    ids = fleet.enqueue("chaos.count", [{"n": n, "ms": rng.randint(100, 300)} for n in range(120)])
    ids += fleet.enqueue("chaos.acount", [{"n": n, "ms": rng.randint(100, 300)} for n in range(60)])
    for slot in ("w1", "w2", "w3"):
        fleet.spawn(slot, die_at=DIE_AT, concurrency=4, batch=4, lease=LEASE)
    fleet.run_until_done(timeout=240, chaos=kill_or_freeze, chaos_every=0.7, chaos_until=13)
    report = fleet.check()

    rows = fleet.rows()
    assert len(rows) == len(ids) == 180
    assert {row["status"] for row in rows} == {"succeeded"}
    events = fleet.events()
    faults = Counter(event.get("fault") for event in events if event.kind == "fault")
    assert faults["killed"], "no worker was killed"
    started = Counter(event.subject for event in events if event.kind == "started")
    assert sum(started.values()) > len(ids), "every job ran once: the faults hit nothing"
    with fleet.engine.connect() as conn:
        total = conn.execute(sa.select(counters.c.n).where(counters.c.name == "chaos")).scalar_one()
        lines = Counter(conn.execute(sa.select(runs.c.job_id)).scalars())
    assert total == len(ids), f"the counter is {total} for {len(ids)} jobs"
    assert sorted(lines) == sorted(ids)
    assert set(lines.values()) == {1}, "a job's writes committed more than once"
    zombies = [event for event in events if event.get("fault") == "stopped"]
    taken_over = [event for event in events if event.kind == "completed" and event.get("changed") is False]
    assert zombies, "no worker was made a zombie"
    print(f"[{fleet.family}] zombies {len(zombies)}, completions refused by the fence {len(taken_over)}")
    report.assert_ok()
    print(f"[{fleet.family}] runs {sum(started.values())} of {len(ids)} jobs, faults {dict(faults)}")
