"""``dibs dashboard`` as a user runs it: it serves the database's dashboard on loopback, and with --token
it lets in only requests that carry the token."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from dibs.engine import shown_url
from dibs.schema import metadata
from tests.acceptance.cli import DIBS, ROOT
from tests.acceptance.cli import dibs as run
from tests.helpers import wait_until


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        httpx.get(url, timeout=1)
    except httpx.HTTPError:
        return False
    return True


def test_the_dashboard_command_serves_the_database_and_asks_for_its_token(tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path / 'dash.sqlite'}"
    assert run(database, tmp_path, "init").returncode == 0
    assert run(database, tmp_path, "queues", "pause", "mail").returncode == 0
    port = _free_port()
    env = {**os.environ, "DIBS_DATABASE_URL": database}
    command = [DIBS, "dashboard", "--port", str(port), "--token", "s3cret", "--read-only"]
    with (tmp_path / "dashboard.log").open("wb") as log:
        server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _answers(url) or server.poll() is not None, timeout=30, what="the dashboard to listen")
        assert server.poll() is None, (tmp_path / "dashboard.log").read_text()
        assert httpx.get(url + "/").status_code == 401
        page = httpx.get(url + "/", headers={"authorization": "Bearer s3cret"})
        assert page.status_code == 200
        assert 'data-queue="mail"' in page.text
        assert "read-only" in page.text
    finally:
        server.terminate()
        server.wait(10)


def test_the_dashboard_command_refuses_a_malformed_basic_auth(tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path / 'dash.sqlite'}"
    refused = run(database, tmp_path, "dashboard", "--basic-auth", "nopassword")
    assert refused.returncode == 1
    assert "--basic-auth takes USER:PASSWORD" in refused.stderr


@pytest.fixture(params=["user", "query"])
def where_the_password_is(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_the_dashboard_command_says_which_database_it_serves_without_its_password(
    tmp_path: Path, postgres_database: sa.URL, where_the_password_is: str
) -> None:
    # A password in the user part, or (libpq takes both) in the query.
    url = postgres_database if postgres_database.password else postgres_database.set(password="s3cret-pw")
    if where_the_password_is == "query" and not postgres_database.password:
        url = postgres_database.update_query_dict({"password": "s3cret-pw"})
    password = str(url.password or url.query["password"])
    database = url.render_as_string(hide_password=False)
    assert run(database, tmp_path, "init").returncode == 0
    port = _free_port()
    env = {**os.environ, "DIBS_DATABASE_URL": database}
    log_path = tmp_path / "dashboard.log"
    with log_path.open("wb") as log:
        server = subprocess.Popen([DIBS, "dashboard", "--port", str(port)], cwd=ROOT, env=env, stdout=log,
                                  stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_until(lambda: "dibs dashboard of" in log_path.read_text() or server.poll() is not None, timeout=30,
                   what="the dashboard to say what it serves")  # fmt: skip
        said = log_path.read_text()
        assert f"dibs dashboard of {shown_url(url)} on http://127.0.0.1:{port}/" in said
        assert password not in said
        assert "***" in said
    finally:
        server.terminate()
        server.wait(10)
        engine = sa.create_engine(database)
        metadata.drop_all(engine)
        engine.dispose()
