"""Pausing, resuming and listing queues from the command line, on every backend."""

from __future__ import annotations

import json
from pathlib import Path

from tests.acceptance.cli import APP
from tests.acceptance.cli import dibs as run


def test_a_paused_queue_is_listed_its_jobs_wait_and_a_resume_lets_a_worker_run_them(
    database: str, tmp_path: Path
) -> None:
    assert run(database, tmp_path, "init").returncode == 0
    assert run(database, tmp_path, "enqueue", APP, "greet", json.dumps({"name": "ada"})).returncode == 0
    paused = run(database, tmp_path, "queues", "pause", "default")
    assert (paused.returncode, paused.stdout.strip()) == (0, "queue default: paused"), paused.stderr
    listed = run(database, tmp_path, "queues", "list")
    assert listed.returncode == 0, listed.stderr
    (row,) = [line.split() for line in listed.stdout.splitlines() if "default" in line]
    assert [cell for cell in row if cell not in "│┃"] == ["default", "yes", "1", "0", "0"]
    worked = run(database, tmp_path, "worker", APP, "--burst")
    assert "0 succeeded" in worked.stdout, worked.stdout + worked.stderr
    assert run(database, tmp_path, "queues", "resume", "default").stdout.strip() == "queue default: resumed"
    worked = run(database, tmp_path, "worker", APP, "--burst")
    assert "1 succeeded" in worked.stdout, worked.stdout + worked.stderr
    assert "yes" not in run(database, tmp_path, "queues", "list").stdout


def test_a_bad_queue_name_is_refused_with_the_rule(database: str, tmp_path: Path) -> None:
    assert run(database, tmp_path, "init").returncode == 0
    refused = run(database, tmp_path, "queues", "pause", "no spaces")
    assert refused.returncode == 1
    assert "a queue name must be 1 to 100 letters" in refused.stderr
