"""``dibs worker``'s log as a user reads it, or a log shipper: one line as a job starts and one as it
finishes (id, task, attempt, duration, outcome), in text or, with ``--log-format json``, one JSON object a
line; each line once, and no library's INFO lines among them."""

from __future__ import annotations

import json
from pathlib import Path

from tests.acceptance.cli import APP
from tests.acceptance.cli import dibs as run


def worked(database: str, tmp_path: Path, *options: str) -> list[str]:
    """The log lines of a burst worker that ran one greet job and one explode job."""
    assert run(database, tmp_path, "init").returncode == 0
    assert run(database, tmp_path, "enqueue", APP, "greet", '{"name": "Ada"}').returncode == 0
    assert run(database, tmp_path, "enqueue", APP, "explode").returncode == 0
    result = run(database, tmp_path, "worker", APP, "--burst", "-c", "1", *options)
    assert result.returncode == 0, result.stderr
    return result.stderr.splitlines()


def test_the_text_log_has_one_line_as_each_job_starts_and_one_as_it_ends(database: str, tmp_path: Path) -> None:
    lines = worked(database, tmp_path)
    jobs = [line.split(": ", 1)[1] for line in lines if " dibs.worker: job " in line]
    assert len(jobs) == 4, lines
    assert jobs[0] == "job 1 (greet) attempt 1 started"
    assert jobs[1].startswith("job 1 (greet) attempt 1 succeeded in ")
    assert jobs[2] == "job 2 (explode) attempt 1 started"
    assert jobs[3].startswith("job 2 (explode) attempt 1 dead in ")
    assert jobs[3].endswith("RuntimeError: this job always fails")
    assert " INFO " in lines[0]
    assert len(set(lines)) == len(lines), "a line was written twice"


def test_the_json_log_has_the_fields_a_log_shipper_reads(database: str, tmp_path: Path) -> None:
    lines = worked(database, tmp_path, "--log-format", "json")
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    jobs = [record for record in records if record["message"].startswith("job ")]
    assert [(r["job_id"], r["task"], r["attempt"], r.get("outcome")) for r in jobs] == [
        (1, "greet", 1, None),
        (1, "greet", 1, "succeeded"),
        (2, "explode", 1, None),
        (2, "explode", 1, "dead"),
    ]
    assert {record["queue"] for record in jobs} == {"default"}
    assert [record["level"] for record in jobs] == ["INFO", "INFO", "INFO", "WARNING"]
    assert all(record["logger"] == "dibs.worker" for record in jobs)
    assert jobs[1]["duration"] >= 0
    assert jobs[3]["error"] == "RuntimeError"
    assert all(record["time"].endswith("+00:00") for record in records)
    # Only dibs's own lines at INFO: no library logs its requests or statements.
    assert {record["logger"].split(".")[0] for record in records if record["level"] == "INFO"} == {"dibs"}
    assert len(set(lines)) == len(lines), "a line was written twice"
