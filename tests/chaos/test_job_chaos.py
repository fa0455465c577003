"""The job queue under faults that hurt: workers SIGKILLed at the worst moments, stopped past their lease
and woken again, terminated with work in hand, poisoned by their own jobs, cut off from the server.
Every scenario runs real worker processes and ends with the history checker (tests/chaos/history.py)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.chaos.fleet import Fleet, fleet_for, kill_connections
from tests.chaos.history import Event

#: Self-inflicted kills: after a claim, half way through a job, between a job's return and its completion.
DIE_AT = "after-claim:0.04,mid-handler:0.01,before-complete:0.04"


@pytest.fixture
def fleet(queue_url: sa.URL, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_for(queue_url, tmp_path)


def of(events: list[Event], kind: str, actor: str | None = None, **fields: object) -> list[Event]:
    return [
        event
        for event in events
        if event.kind == kind
        and (actor is None or event.actor == actor)
        and all(event.get(name) == value for name, value in fields.items())
    ]


def kill_a_worker(fleet: Fleet) -> None:
    alive = fleet.alive()
    if alive:
        fleet.kill(random.choice(alive))


def test_workers_killed_at_random_points_lose_nothing_and_keep_each_keys_order(fleet: Fleet) -> None:
    rng = random.Random()
    fleet.enqueue("chaos.work", [{"n": n, "ms": rng.randint(5, 40)} for n in range(150)])
    fleet.enqueue("chaos.awork", [{"n": n, "ms": rng.randint(5, 40)} for n in range(60)])
    # Keyed jobs go in key by key, interleaved, so that each key's jobs are spread over the id range.
    fleet.enqueue("chaos.keyed", [{"key": f"k{n % 6}", "n": n, "ms": rng.randint(10, 30)} for n in range(90)])
    for slot in ("w1", "w2", "w3"):
        fleet.spawn(slot, die_at=DIE_AT, concurrency=4, batch=6, lease=1.0)
    fleet.run_until_done(timeout=150, chaos=kill_a_worker, chaos_every=0.7, chaos_until=5)
    report = fleet.check()
    report.assert_ok()
    events = fleet.events()
    external = of(events, "fault", "harness", fault="killed")
    inflicted = [event for event in of(events, "fault", fault="killed") if event.actor != "harness"]
    assert external, "no worker was killed from outside"
    assert inflicted, "no worker killed itself at any of the points"
    assert report.lost == 0
    assert report.jobs == 300
    assert sum(1 for row in fleet.rows() if row["ordering_key"] is not None) == 90
    # Kills mid-job or before the completion make jobs run again: each of those must have been explained.
    assert report.duplicates == 0 or report.explained["crash"] + report.explained["expiry"] > 0


def test_sigterm_lets_running_jobs_finish_and_leaves_no_claimed_job_unstarted(fleet: Fleet) -> None:
    fleet.enqueue("chaos.work", [{"n": n, "ms": 400} for n in range(40)])
    # A batch larger than its runners: still, every job it claims starts at once.
    first = fleet.spawn("w1", concurrency=2, batch=8, lease=1.5, grace=10)
    fleet.wait_for(lambda: len(of(fleet.events(), "started", first.actor)) >= 4, what="the first worker to run jobs")
    fleet.terminate(first)
    assert first.process.wait(30) == 0, "a worker stopped by SIGTERM should exit cleanly"
    fleet.spawn("w2", concurrency=4, lease=1.5)
    fleet.run_until_done(timeout=90)
    report = fleet.check()
    report.assert_ok()

    events = fleet.events()
    (terminated,) = of(events, "fault", "harness", fault="terminated")
    claimed = {(event.subject, event.token): event for event in of(events, "claimed", first.actor)}
    started = {(event.subject, event.token) for event in of(events, "started", first.actor)}
    released = of(events, "released", first.actor)
    done = {(event.subject, event.token) for event in of(events, "completed", first.actor, changed=True)}
    assert started <= done, "a running job did not finish"
    # A claim that came back as the worker stopped is given back at once, before its lease would have
    # expired; every other job it claimed, it ran.
    for event in released:
        assert event.get("changed") is True
        assert terminated.at <= event.at < claimed[(event.subject, event.token)].get("expires_at")
    assert set(claimed) == started | {(event.subject, event.token) for event in released}
    assert not started & {(event.subject, event.token) for event in released}
    assert report.duplicates == 0
    assert report.explained.get("release", 0) == len(released)


def test_a_zombie_worker_past_its_lease_changes_nothing_when_it_wakes(fleet: Fleet) -> None:
    (slow,) = fleet.enqueue("chaos.slow", [{"seconds": 2.0}])
    zombie = fleet.spawn("z", concurrency=1, lease=1.0)
    fleet.wait_for(lambda: of(fleet.events(), "started", zombie.actor), what="the zombie to start its job")
    fleet.stop(zombie)
    fleet.enqueue("chaos.work", [{"n": n, "ms": 10} for n in range(40)])
    taker = fleet.spawn("w", concurrency=4, lease=1.0)
    fleet.wait_for(
        lambda: any(row["id"] == slow and row["status"] == "succeeded" for row in fleet.rows()),
        what="another worker to take the zombie's job over and finish it",
    )
    fleet.resume(zombie)
    late = fleet.wait_for(
        lambda: of(fleet.events(), "completed", zombie.actor),
        what="the zombie's late completion",
    )
    fleet.run_until_done(timeout=60)
    report = fleet.check()
    report.assert_ok()

    events = fleet.events()
    assert [(event.subject, event.token, event.get("changed")) for event in late[:1]] == [(str(slow), 1, False)]
    winners = of(events, "completed", taker.actor, changed=True, status="succeeded", token=2)
    assert str(slow) in {event.subject for event in winners}, "the job was not completed by the worker that took it"
    (row,) = [row for row in fleet.rows() if row["id"] == slow]
    assert (row["status"], row["lease_token"], row["attempts"]) == ("succeeded", 2, 2)
    assert report.stale >= 1
    assert report.explained["crash"] >= 1
    assert report.duplicates >= 1


def test_poison_jobs_end_dead_and_the_jobs_around_them_succeed(fleet: Fleet) -> None:
    fleet.enqueue("chaos.work", [{"n": n, "ms": 10} for n in range(60)])
    (failing,) = fleet.enqueue("chaos.fail", [{}])
    (hanging,) = fleet.enqueue("chaos.hang", [{}])
    fleet.enqueue("chaos.awork", [{"n": n, "ms": 10} for n in range(60)])
    for slot in ("w1", "w2"):
        fleet.spawn(slot, concurrency=4, lease=1.0)
    fleet.run_until_done(timeout=90)
    # The job that kills its worker comes after: it would otherwise take the hanging job's attempts with it.
    (suicidal,) = fleet.enqueue("chaos.suicide", [{}])
    fleet.enqueue("chaos.work", [{"n": n, "ms": 10} for n in range(60, 120)])
    fleet.run_until_done(timeout=90)
    report = fleet.check(expect={failing: "dead", hanging: "dead", suicidal: "dead"})
    report.assert_ok()

    rows = {row["id"]: row for row in fleet.rows()}
    assert rows[failing]["attempts"] == 3
    assert "RuntimeError: poison job" in rows[failing]["last_error"]
    assert rows[hanging]["attempts"] == 2
    assert "timeout of 0.3 seconds" in rows[hanging]["last_error"]
    assert rows[suicidal]["attempts"] == 2
    assert "stopped renewing its lease" in rows[suicidal]["last_error"]
    assert len(of(fleet.events(), "fault", fault="killed", point="poison")) == 2
    others = [row for job, row in rows.items() if job not in (failing, hanging, suicidal)]
    assert len(others) == 180
    assert all(row["status"] == "succeeded" for row in others)


def test_workers_ride_out_server_side_connection_kills(fleet: Fleet) -> None:
    if fleet.family == "sqlite":
        pytest.skip("an embedded database has no server that could kill a connection")
    fleet.enqueue("chaos.work", [{"n": n, "ms": 40} for n in range(200)])
    fleet.enqueue("chaos.awork", [{"n": n, "ms": 40} for n in range(100)])
    for slot in ("w1", "w2"):
        fleet.spawn(slot, concurrency=4, batch=8, lease=1.0)
    # Running workers must ride the kills out; a worker's start (a schema check) is not retried.
    fleet.wait_for(
        lambda: {event.actor for event in of(fleet.events(), "claimed")} == {"w1.0", "w2.0"},
        what="both workers to claim jobs",
    )
    fleet.run_until_done(timeout=120, chaos=kill_connections, chaos_every=0.25, chaos_until=20)
    alive = {worker.actor for worker in fleet.alive()}
    report = fleet.check()
    report.assert_ok()
    kills = of(fleet.events(), "fault", fault="connections-killed")
    assert kills
    assert sum(event.get("sessions") for event in kills) > 0
    assert fleet.incarnations == {"w1": 0, "w2": 0}, "a worker died instead of reconnecting"
    assert alive == {"w1.0", "w2.0"}
