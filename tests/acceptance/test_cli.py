"""The dibs command, run as a subprocess exactly as a user types it, on every backend."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.acceptance.cli import APP, DIBS, ROOT, dibs


def test_enqueue_with_a_dedupe_key_a_live_job_holds_says_nothing_was_enqueued(database: str, tmp_path: Path) -> None:
    assert dibs(database, tmp_path, "init").returncode == 0
    first = dibs(database, tmp_path, "enqueue", APP, "greet", '{"name": "ada"}', "--dedupe-key", "welcome-ada")
    assert first.returncode == 0, first.stderr
    job_id = first.stdout.split()[2]
    assert first.stdout.startswith(f"enqueued job {job_id} (")
    again = dibs(database, tmp_path, "enqueue", APP, "greet", '{"name": "ada"}', "--dedupe-key", "welcome-ada")
    assert again.returncode == 0, again.stderr
    assert f"job {job_id} (" in again.stdout
    assert "already holds dedupe key 'welcome-ada': nothing enqueued; it is queued" in again.stdout
    other = dibs(database, tmp_path, "enqueue", APP, "greet", '{"name": "bo"}', "--dedupe-key", "welcome-bo")
    assert other.stdout.startswith("enqueued job ")
    refused = dibs(database, tmp_path, "enqueue", APP, "greet", '{"name": "x"}', "--dedupe-key", "k" * 201)
    assert refused.returncode == 1
    assert "dedupe_key must be a string of 1 to 200 characters" in refused.stderr


def test_init_enqueue_work_and_inspect(database: str, tmp_path: Path) -> None:
    first = dibs(database, tmp_path, "init")
    assert first.returncode == 0, first.stderr
    assert "applied migration(s) 1" in first.stdout
    assert "up to date" in dibs(database, tmp_path, "init").stdout

    for name in ("ada", "grace"):
        enqueued = dibs(database, tmp_path, "enqueue", APP, "greet", f'{{"name": "{name}"}}')
        assert enqueued.returncode == 0, enqueued.stderr
        assert "enqueued job" in enqueued.stdout
    assert dibs(database, tmp_path, "enqueue", APP, "explode").returncode == 0

    status = dibs(database, tmp_path, "status")
    assert status.returncode == 0, status.stderr
    assert "default" in status.stdout
    assert "│      3 │" in status.stdout.replace("┃", "│")  # three queued

    worked = dibs(database, tmp_path, "worker", APP, "--burst", "--concurrency", "2", "--connections", "1")
    assert worked.returncode == 0, worked.stderr
    assert "2 succeeded" in worked.stdout
    assert "1 dead" in worked.stdout
    assert sorted((tmp_path / "out.txt").read_text().splitlines()) == ["hello ada", "hello grace"]

    dead = dibs(database, tmp_path, "jobs", "list", "--status", "dead")
    assert "explode" in dead.stdout
    assert "RuntimeError: this job always fails" in dead.stdout
    dead_id = next(line.split("│")[1].strip() for line in dead.stdout.splitlines() if "explode" in line)
    retried = dibs(database, tmp_path, "jobs", "retry", dead_id)
    assert f"job {dead_id}: queued" in retried.stdout
    cancelled = dibs(database, tmp_path, "jobs", "cancel", dead_id)
    assert f"job {dead_id}: cancelled" in cancelled.stdout

    purged = dibs(database, tmp_path, "jobs", "purge", "--all", "--yes")
    assert "deleted 2 succeeded, 1 cancelled jobs" in purged.stdout
    assert "no jobs yet" in dibs(database, tmp_path, "status").stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["enqueue", APP, "nope"], "no task named 'nope' is registered; registered tasks: explode, greet, sleepy"),
        (["enqueue", APP, "greet", "not json"], "ARGS must be a JSON object"),
        (["enqueue", APP, "greet", '{"name": "x"}', "--delay", "-1"], "delay must not be negative"),
        (["enqueue", APP, "greet", '{"name": "x"}', "--queue", "elsewhere"], "no task is on queue 'elsewhere'"),
        (["enqueue", "tests.acceptance.missing:app", "greet"], "cannot import 'tests.acceptance.missing'"),
        (["jobs", "cancel", "424242"], "there is no job 424242"),
        (["worker", APP, "--burst", "--connections", "3"], "'--connections': 3 is not in the range 1<=x<=2"),
    ],
)
def test_bad_input_says_what_to_do_and_writes_nothing(
    database: str, tmp_path: Path, args: list[str], message: str
) -> None:
    assert dibs(database, tmp_path, "init").returncode == 0
    result = dibs(database, tmp_path, *args)
    assert result.returncode != 0
    assert message in result.stderr
    engine = sa.create_engine(database)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM dibs_jobs")).scalar_one() == 0
    engine.dispose()


def test_worker_on_a_database_without_tables_says_to_run_init(database: str, tmp_path: Path) -> None:
    result = dibs(database, tmp_path, "worker", APP, "--burst")
    assert result.returncode == 1
    assert "run `dibs --db URL init" in result.stderr


def test_commands_on_a_database_without_tables_or_out_of_reach_say_so(tmp_path: Path) -> None:
    empty = dibs("sqlite:///" + str(tmp_path / "empty.sqlite"), tmp_path, "status")
    assert empty.returncode == 1
    assert "has no dibs tables; run `dibs --db URL init" in empty.stderr
    away = dibs("postgresql+psycopg://nobody@127.0.0.1:1/nowhere", tmp_path, "jobs", "list")
    assert away.returncode == 1
    assert "the database refused or could not be reached" in away.stderr
    assert "Traceback" not in away.stderr


def test_sigterm_past_the_grace_period_ends_the_worker_process(database: str, tmp_path: Path) -> None:
    assert dibs(database, tmp_path, "init").returncode == 0
    assert dibs(database, tmp_path, "enqueue", APP, "sleepy", '{"seconds": 60}').returncode == 0
    env = {**os.environ, "DIBS_DATABASE_URL": database, "DIBS_CLI_TEST_OUT": str(tmp_path / "started")}
    worker = subprocess.Popen(
        [DIBS, "worker", APP, "--grace", "0.5"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not (tmp_path / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "started").exists(), "the job never started"
    stopping = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    _, err = worker.communicate(timeout=20)
    assert time.monotonic() - stopping < 10
    assert worker.returncode == 1
    assert "1 sync job(s) were still running when the worker stopped (past the grace period" in err
