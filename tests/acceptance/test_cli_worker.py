"""``dibs worker`` and ``dibs enqueue`` as a user runs them: the database they were given is the one used,
metrics stay on this machine unless opened on purpose, and a second signal stops the wait for running jobs."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.acceptance.cli import APP, DIBS, ROOT
from tests.acceptance.cli import dibs as run
from tests.helpers.network import answers, free_port, outward_address

#: An app that names its database itself, as many do: dibs.App(url).
OWN_APP = """
import os

import dibs

app = dibs.App(os.environ["OWN_DATABASE_URL"])


@app.task(name="greet")
def greet(name: str) -> None: ...
"""


def run_own(tmp_path: Path, own: str, *args: str, db: str | None = None) -> subprocess.CompletedProcess[str]:
    """The dibs command on the app of OWN_APP, which names ``own``; ``db`` as $DIBS_DATABASE_URL."""
    (tmp_path / "own_app.py").write_text(OWN_APP)
    env = {key: value for key, value in os.environ.items() if key != "DIBS_DATABASE_URL"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    env["OWN_DATABASE_URL"] = own
    if db is not None:
        env["DIBS_DATABASE_URL"] = db
    return subprocess.run(
        [DIBS, *args], capture_output=True, stdin=subprocess.DEVNULL, text=True, timeout=60, cwd=ROOT, env=env
    )


def job_count(url: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT count(*) FROM dibs_jobs")).scalar_one())
    finally:
        engine.dispose()


def test_an_app_with_a_database_of_its_own_and_another_db_given_is_refused(database: str, tmp_path: Path) -> None:
    other = f"sqlite:///{tmp_path / 'other.sqlite'}"
    for url in (database, other):
        assert run(url, tmp_path, "init").returncode == 0

    given = run_own(tmp_path, database, "--db", other, "enqueue", "own_app:app", "greet", '{"name": "x"}')
    assert given.returncode == 1
    assert "own_app:app uses the database " in given.stderr
    assert f"but --db names {other}" in given.stderr
    assert "Traceback" not in given.stderr
    from_env = run_own(tmp_path, database, "worker", "own_app:app", "--burst", db=other)
    assert from_env.returncode == 1
    assert "but $DIBS_DATABASE_URL names" in from_env.stderr
    assert job_count(database) == job_count(other) == 0

    # The same database, named either way, or none named: the app's own is used.
    same = run_own(tmp_path, database, "--db", database, "enqueue", "own_app:app", "greet", '{"name": "x"}')
    assert same.returncode == 0, same.stderr
    assert run_own(tmp_path, database, "enqueue", "own_app:app", "greet", '{"name": "y"}').returncode == 0
    worked = run_own(tmp_path, database, "worker", "own_app:app", "--burst", db=database)
    assert "2 succeeded" in worked.stdout, worked.stderr
    assert job_count(other) == 0


@pytest.mark.parametrize("address", [None, "0.0.0.0"])
def test_worker_metrics_stay_on_this_machine_unless_an_address_is_given(tmp_path: Path, address: str | None) -> None:
    outward = outward_address()
    if outward is None:
        pytest.skip("this machine has no network address besides loopback to try the metrics port from")
    database = f"sqlite:///{tmp_path / 'metrics.sqlite'}"
    assert run(database, tmp_path, "init").returncode == 0
    port = free_port()
    wider = [] if address is None else ["--metrics-address", address]
    worker = subprocess.Popen(
        [DIBS, "worker", APP, "--metrics-port", str(port), *wider],
        cwd=ROOT,
        env={**os.environ, "DIBS_DATABASE_URL": database, "DIBS_CLI_TEST_OUT": str(tmp_path / "out")},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not answers("127.0.0.1", port) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert answers("127.0.0.1", port), "the metrics port never opened"
        assert answers(outward, port) is (address == "0.0.0.0")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=30)
    assert worker.returncode == 0


def test_a_second_sigterm_stops_waiting_for_running_jobs(database: str, tmp_path: Path) -> None:
    assert run(database, tmp_path, "init").returncode == 0
    enqueued = run(database, tmp_path, "enqueue", APP, "sleepy", '{"seconds": 60}')
    job_id = enqueued.stdout.split()[2]
    env = {**os.environ, "DIBS_DATABASE_URL": database, "DIBS_CLI_TEST_OUT": str(tmp_path / "started")}
    worker = subprocess.Popen(
        [DIBS, "worker", APP, "--grace", "30"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "started").exists(), "the job never started"
        shown = run(database, tmp_path, "jobs", "show", job_id)
        assert "status            running" in shown.stdout
        lease = next(line for line in shown.stdout.splitlines() if "lease expires at" in line)
        assert lease.rstrip().endswith("UTC")
        stopping = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert worker.poll() is None, "the first signal gives running jobs their grace period"
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=20)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert time.monotonic() - stopping < 10, "the second signal should not wait out the 30 s grace period"
    assert worker.returncode == 1
    assert "1 sync job(s) were still running when the worker stopped" in err


def test_a_metrics_port_already_taken_is_one_clear_line(tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path / 'taken.sqlite'}"
    assert run(database, tmp_path, "init").returncode == 0
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = run(database, tmp_path, "worker", APP, "--burst", "--metrics-port", str(port))
    assert refused.returncode == 1
    assert f"cannot serve metrics on 127.0.0.1:{port} (Address already in use)" in refused.stderr
    assert "Traceback" not in refused.stderr
