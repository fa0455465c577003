"""Jobs that wait for other jobs, under workers SIGKILLed at the worst moments: no child starts before every
parent succeeded, and none is lost (each chain and group ends with every job succeeded)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

import dibs
from dibs.schema import job_parents
from tests.chaos.fleet import Fleet, fleet_for

#: Self-inflicted kills: after a claim, half way through a job, between a job's return and its completion.
DIE_AT = "after-claim:0.04,mid-handler:0.01,before-complete:0.04"


@pytest.fixture
def fleet(queue_url: sa.URL, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_for(queue_url, tmp_path)


def kill_a_worker(fleet: Fleet) -> None:
    alive = fleet.alive()
    if alive:
        fleet.kill(random.choice(alive))


def test_killed_workers_never_start_a_child_before_its_parents_and_lose_none(fleet: Fleet) -> None:
    rng = random.Random()

    def step(n: int) -> dibs.Step:
        return dibs.Step("chaos.work", {"n": n, "ms": rng.randint(5, 30)})

    made: list[dibs.Job] = []
    for n in range(25):
        made.extend(fleet.app.chain(step(n), step(n), step(n)))
    for n in range(5):
        made.extend(fleet.app.group([step(n) for _ in range(6)], then=step(n)))
    fleet.committed.extend(job.id for job in made)
    for slot in ("w1", "w2", "w3"):
        fleet.spawn(slot, die_at=DIE_AT, concurrency=4, batch=6, lease=1.0)
    fleet.run_until_done(timeout=180, chaos=kill_a_worker, chaos_every=0.7, chaos_until=5)

    rows = fleet.rows()
    assert len(rows) == len(made) == 110
    assert {row["status"] for row in rows} == {"succeeded"}, "a job was lost or cancelled"
    events = fleet.events()
    assert any(event.kind == "fault" for event in events), "no worker was killed"
    started: dict[str, float] = {}
    returned: dict[str, float] = {}
    for event in events:
        if event.kind == "started":
            started[event.subject] = min(started.get(event.subject, event.at), event.at)
        elif event.kind == "finished" and event.get("outcome") == "returned":
            returned[event.subject] = max(returned.get(event.subject, event.at), event.at)
    with fleet.engine.connect() as conn:
        edges = conn.execute(sa.select(job_parents.c.child_id, job_parents.c.parent_id)).all()
    assert len(edges) == 25 * 2 + 5 * 6
    early = [
        (child, parent)
        for child, parent in edges
        if started[str(child)] < returned[str(parent)]  # a child's first start before its parent's last return
    ]
    assert early == []
    fleet.check().assert_ok()
