"""Showing, retrying, cancelling and purging jobs and outbox events from the command line, on every backend:
a destructive command says what it deletes and keeps dead letters, a missing id changes nothing."""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa

import dibs
from dibs import Outbox
from dibs.schema import jobs, outbox
from tests.acceptance.cli import APP, DIBS, add_events
from tests.acceptance.cli import dibs as run


def states(database: str, table: str) -> dict[str, int]:
    engine = sa.create_engine(database)
    try:
        with engine.connect() as conn:
            return dict(conn.execute(sa.text(f"SELECT status, count(*) FROM {table} GROUP BY status")).all())
    finally:
        engine.dispose()


def execute(database: str, statement: str | sa.Executable) -> None:
    engine = sa.create_engine(database)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(statement) if isinstance(statement, str) else statement)
    finally:
        engine.dispose()


def finished_jobs(database: str, tmp_path: Path) -> dict[str, int]:
    """Two succeeded jobs, one dead, one cancelled: their ids by task (the cancelled one as "cancelled")."""
    assert run(database, tmp_path, "init").returncode == 0
    for name in ("ada", "grace"):
        assert run(database, tmp_path, "enqueue", APP, "greet", json.dumps({"name": name})).returncode == 0
    assert run(database, tmp_path, "enqueue", APP, "explode").returncode == 0
    worked = run(database, tmp_path, "worker", APP, "--burst")
    assert "2 succeeded" in worked.stdout, worked.stderr
    later = run(database, tmp_path, "enqueue", APP, "greet", '{"name": "later"}', "--delay", "3600")
    later_id = later.stdout.split()[2]
    assert run(database, tmp_path, "jobs", "cancel", later_id).returncode == 0
    return {"explode": int(_id_of(database, "explode")), "cancelled": int(later_id)}


def _id_of(database: str, task: str) -> str:
    engine = sa.create_engine(database)
    try:
        with engine.connect() as conn:
            return str(conn.execute(sa.text("SELECT id FROM dibs_jobs WHERE task = :t"), {"t": task}).scalar_one())
    finally:
        engine.dispose()


def test_jobs_purge_needs_an_age_or_all_says_what_it_deletes_and_keeps_dead_jobs(database: str, tmp_path: Path) -> None:
    finished_jobs(database, tmp_path)
    before = {"succeeded": 2, "dead": 1, "cancelled": 1}
    assert states(database, "dibs_jobs") == before

    bare = run(database, tmp_path, "jobs", "purge")
    assert bare.returncode == 2
    assert "pass --older-than HOURS (finished at least that long ago) or --all" in bare.stderr
    both = run(database, tmp_path, "jobs", "purge", "--all", "--older-than", "1")
    assert both.returncode == 2
    assert "not both" in both.stderr
    unasked = run(database, tmp_path, "jobs", "purge", "--all")
    assert unasked.returncode == 1
    assert "this deletes 2 succeeded, 1 cancelled jobs finished (dead jobs are kept" in unasked.stdout
    assert "nothing was deleted: there is no terminal to ask on; pass --yes" in unasked.stderr
    assert states(database, "dibs_jobs") == before

    # One succeeded job finished two days ago: only it is old enough.
    first = sa.select(sa.func.min(jobs.c.id)).where(jobs.c.status == "succeeded").scalar_subquery()
    two_days_ago = datetime.now(timezone.utc) - timedelta(days=2)
    execute(database, sa.update(jobs).where(jobs.c.id == first).values(finished_at=two_days_ago))
    aged = run(database, tmp_path, "jobs", "purge", "--older-than", "24", "--yes")
    assert aged.returncode == 0, aged.stderr
    assert "this deletes 1 succeeded, 0 cancelled jobs finished more than 24 hours ago" in aged.stdout
    assert "deleted 1 succeeded, 0 cancelled jobs" in aged.stdout
    assert states(database, "dibs_jobs") == {"succeeded": 1, "dead": 1, "cancelled": 1}

    everything = run(database, tmp_path, "jobs", "purge", "--all", "--yes")
    assert "deleted 1 succeeded, 1 cancelled jobs" in everything.stdout
    assert states(database, "dibs_jobs") == {"dead": 1}
    nothing = run(database, tmp_path, "jobs", "purge", "--all", "--yes")
    assert nothing.returncode == 0
    assert "nothing to delete (dead jobs are kept: add --status dead" in nothing.stdout

    dead = run(database, tmp_path, "jobs", "purge", "--all", "--status", "dead", "--yes")
    assert "this deletes 1 dead jobs finished" in dead.stdout
    assert "deleted 1 dead jobs" in dead.stdout
    assert states(database, "dibs_jobs") == {}


def test_jobs_show_prints_everything_including_the_full_traceback(database: str, tmp_path: Path) -> None:
    ids = finished_jobs(database, tmp_path)
    shown = run(database, tmp_path, "jobs", "show", str(ids["explode"]))
    assert shown.returncode == 0, shown.stderr
    for expected in (
        f"job {ids['explode']}",
        "task              explode",
        "queue             default",
        "status            dead",
        "arguments         {}",
        "attempts          1 of 1",
        "priority          0",
        "lease owner       ",
        "lease expires at  -",
        "last error:\nRuntimeError: this job always fails",
        "Traceback (most recent call last)",
        'raise RuntimeError("this job always fails")',
    ):
        assert expected in shown.stdout
    for moment in ("enqueued at", "run at", "started at", "finished at"):
        line = next(line for line in shown.stdout.splitlines() if line.strip().startswith(moment))
        assert line.rstrip().endswith("UTC"), line

    as_json = json.loads(run(database, tmp_path, "jobs", "show", "--json", str(ids["cancelled"])).stdout)
    assert as_json["status"] == "cancelled"
    assert as_json["args"] == {"name": "later"}
    assert as_json["attempts"] == 0
    assert as_json["last_error"] == "cancelled before it ran"
    assert set(as_json) >= {"enqueued_at", "run_at", "started_at", "finished_at", "lease_owner", "lease_expires_at"}

    missing = run(database, tmp_path, "jobs", "show", "424242")
    assert missing.returncode == 1
    assert "there is no job 424242" in missing.stderr


def test_job_commands_check_every_id_before_changing_any(database: str, tmp_path: Path) -> None:
    assert run(database, tmp_path, "init").returncode == 0
    queued = run(database, tmp_path, "enqueue", APP, "greet", '{"name": "x"}').stdout.split()[2]
    for command in ("cancel", "retry"):
        attempt = run(database, tmp_path, "jobs", command, queued, "424242")
        assert attempt.returncode == 1
        assert "there is no job 424242" in attempt.stderr
        assert states(database, "dibs_jobs") == {"queued": 1}


def test_jobs_retry_checks_every_job_is_dead_or_cancelled_before_queueing_any(database: str, tmp_path: Path) -> None:
    assert run(database, tmp_path, "init").returncode == 0
    cancelled = run(database, tmp_path, "enqueue", APP, "greet", '{"name": "x"}').stdout.split()[2]
    succeeded = run(database, tmp_path, "enqueue", APP, "greet", '{"name": "y"}').stdout.split()[2]
    assert run(database, tmp_path, "jobs", "cancel", cancelled).returncode == 0
    execute(database, sa.update(jobs).where(jobs.c.id == int(succeeded)).values(status="succeeded"))
    attempt = run(database, tmp_path, "jobs", "retry", cancelled, succeeded)
    assert attempt.returncode == 1
    assert f"job {succeeded} is succeeded; only dead or cancelled jobs can be retried" in attempt.stderr
    assert states(database, "dibs_jobs") == {"cancelled": 1, "succeeded": 1}  # the cancelled one not queued


def test_jobs_retry_of_a_workflow_retries_the_parent_before_the_job_waiting_for_it(
    database: str, tmp_path: Path
) -> None:
    assert run(database, tmp_path, "init").returncode == 0
    app = dibs.App(database)
    greet = app.task(name="greet")(lambda name: None)
    parent = app.enqueue(greet, {"name": "first"})
    child = app.enqueue(greet, {"name": "second"}, after=[parent])
    app.cancel(parent.id)  # its child is cancelled with it
    retried = run(database, tmp_path, "jobs", "retry", str(child.id), str(parent.id), str(child.id))
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout.splitlines() == [f"job {parent.id}: queued", f"job {child.id}: waiting"]
    app.engine.dispose()


@pytest.mark.parametrize("command", [["jobs", "show"], ["jobs", "retry"], ["jobs", "cancel"], ["outbox", "show"],
                                     ["outbox", "discard"], ["outbox", "requeue"]])  # fmt: skip
def test_an_id_no_table_can_hold_is_one_clear_line(database: str, tmp_path: Path, command: list[str]) -> None:
    assert run(database, tmp_path, "init").returncode == 0
    refused = run(database, tmp_path, *command, str(2**63))
    assert refused.returncode == 2
    assert "is not in the range 1<=x<=9223372036854775807" in refused.stderr
    assert "Traceback" not in refused.stderr


def abandoned_and_pending(database: str, tmp_path: Path) -> tuple[int, int]:
    assert run(database, tmp_path, "init").returncode == 0
    first, second = add_events(database, 2)
    abandoned = {"status": "abandoned", "last_error": "boom\nline two"}
    execute(database, sa.update(outbox).where(outbox.c.id == first).values(**abandoned))
    return first, second


def test_outbox_show_prints_every_field_headers_payload_and_error(database: str, tmp_path: Path) -> None:
    first, second = abandoned_and_pending(database, tmp_path)
    shown = run(database, tmp_path, "outbox", "show", str(first))
    assert shown.returncode == 0, shown.stderr
    for expected in (
        f"event {first}",
        "target            default",
        "aggregate type    order",
        "aggregate id      0",
        "event type        order.placed",
        "status            abandoned",
        "retry count       0",
        "created at",
        "published at      -",
        "headers           {}",
        'payload:\n{\n  "n": 0\n}',
        "last error:\nboom\nline two",
    ):
        assert expected in shown.stdout
    as_json = json.loads(run(database, tmp_path, "outbox", "show", "--json", str(second)).stdout)
    assert as_json["payload"] == {"n": 1}
    assert as_json["status"] == "pending"
    assert as_json["headers"] == {}
    missing = run(database, tmp_path, "outbox", "show", "424242")
    assert missing.returncode == 1
    assert "there is no outbox event 424242" in missing.stderr


def test_outbox_requeue_and_discard_of_a_missing_or_wrong_event_change_nothing(database: str, tmp_path: Path) -> None:
    first, second = abandoned_and_pending(database, tmp_path)
    for command in ("requeue", "discard"):
        missing = run(database, tmp_path, "outbox", command, str(first), "424242")
        assert missing.returncode == 1, command
        assert "there is no outbox event 424242" in missing.stderr
    wrong = run(database, tmp_path, "outbox", "requeue", str(first), str(second))
    assert wrong.returncode == 1
    assert f"event {second} is pending; only failed or abandoned events can be requeued" in wrong.stderr
    kept = run(database, tmp_path, "outbox", "discard", str(first), str(second))
    assert kept.returncode == 1
    assert f"event {second} is pending; only abandoned events can be discarded" in kept.stderr
    assert states(database, "dibs_outbox") == {"abandoned": 1, "pending": 1}
    assert "requeued 1 events" in run(database, tmp_path, "outbox", "requeue", str(first)).stdout


def test_outbox_purge_needs_an_age_or_all_and_never_takes_abandoned_events(database: str, tmp_path: Path) -> None:
    first, _ = abandoned_and_pending(database, tmp_path)
    published = {"status": "published", "published_at": datetime.now(timezone.utc)}
    execute(database, sa.update(outbox).where(outbox.c.status == "pending").values(**published))
    bare = run(database, tmp_path, "outbox", "purge")
    assert bare.returncode == 2
    assert "pass --older-than HOURS (finished at least that long ago) or --all" in bare.stderr
    young = run(database, tmp_path, "outbox", "purge", "--older-than", "24", "--yes")
    assert "no events published more than 24 hours ago: nothing to delete" in young.stdout
    unasked = run(database, tmp_path, "outbox", "purge", "--all")
    assert unasked.returncode == 1
    assert "this deletes 1 events published" in unasked.stdout
    assert states(database, "dibs_outbox") == {"abandoned": 1, "published": 1}
    purged = run(database, tmp_path, "outbox", "purge", "--all", "--yes")
    assert "deleted 1 published events" in purged.stdout
    # Abandoned events are dead letters: a purge never takes them, a discard by id does.
    assert states(database, "dibs_outbox") == {"abandoned": 1}
    assert "discarded 1 abandoned events" in run(database, tmp_path, "outbox", "discard", str(first)).stdout


def test_at_a_terminal_purge_asks_and_a_no_deletes_nothing(tmp_path: Path) -> None:
    pty = pytest.importorskip("pty", reason="asking needs a terminal, and this system has no pseudo-terminals")
    database = f"sqlite:///{tmp_path / 'ask.sqlite'}"
    finished_jobs(database, tmp_path)
    for answer, expected, left in (("n", "nothing was deleted", 4), ("y", "deleted 2 succeeded, 1 cancelled", 1)):
        terminal, inside = pty.openpty()
        env = {**os.environ, "DIBS_DATABASE_URL": database}
        purge = subprocess.Popen([DIBS, "jobs", "purge", "--all"], stdin=inside, stdout=inside, stderr=inside, env=env)
        os.close(inside)
        said, deadline = b"", time.monotonic() + 30
        while b"delete them? [y/N]" not in said:
            assert time.monotonic() < deadline, f"no question asked: {said!r}"
            if select.select([terminal], [], [], 1)[0]:
                said += os.read(terminal, 1024)
        assert b"this deletes 2 succeeded, 1 cancelled jobs finished" in said
        os.write(terminal, f"{answer}\n".encode())
        assert purge.wait(30) == 0
        with contextlib.suppress(OSError):  # the terminal is gone once the command ended
            while chunk := os.read(terminal, 1024):
                said += chunk
        os.close(terminal)
        assert expected in said.decode()
        assert sum(states(database, "dibs_jobs").values()) == left


def test_lists_show_text_from_the_database_as_written(database: str, tmp_path: Path) -> None:
    ids = finished_jobs(database, tmp_path)
    # An error and names that rich would read as markup (a closing tag with nothing open fails outright).
    execute(database, sa.update(jobs).where(jobs.c.id == ids["explode"]).values(last_error="[/etc/app.conf] missing"))
    outbox_store = Outbox(database)
    try:
        with outbox_store.engine.begin() as conn:
            outbox_store.add(conn, "[/oops]", "[bold]7", "order.placed", {}, target="[/t]")
    finally:
        outbox_store.engine.dispose()
    for command, expected in (
        (["jobs", "list"], "[/etc/app.conf] missing"),
        (["outbox", "list"], "[/oops]/[bold]7"),
        (["outbox", "status"], "[/t]"),
    ):
        shown = run(database, tmp_path, *command)
        assert (shown.returncode, shown.stderr) == (0, ""), command
        assert expected in shown.stdout, shown.stdout


@pytest.mark.parametrize("hours", ["1e12", "inf", "nan"])
def test_an_age_in_hours_out_of_range_is_one_clear_line(database: str, tmp_path: Path, hours: str) -> None:
    assert run(database, tmp_path, "init").returncode == 0
    for command in (
        ["jobs", "purge", "--older-than", hours, "--yes"],
        ["outbox", "purge", "--older-than", hours, "--yes"],
        ["worker", APP, "--burst", "--retention", hours],
        ["outbox", "relay", "-p", "log://", "--burst", "--retention", hours],
    ):
        refused = run(database, tmp_path, *command)
        assert refused.returncode == 1, (command, refused.stderr)
        assert "Traceback" not in refused.stderr
        assert "takes hours" in refused.stderr, refused.stderr
