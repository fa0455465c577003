"""Bad input to every command: one clear line on stderr, a non-zero exit, no traceback, no password."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.acceptance.cli import APP, DIBS, ROOT

MISSING_APP = "tests.acceptance.no_such_module:app"

#: Every command, with what it needs to get as far as the database.
COMMANDS = [
    ["init"],
    ["status"],
    ["worker", APP, "--burst"],
    ["enqueue", APP, "greet", '{"name": "x"}'],
    ["jobs", "list"],
    ["jobs", "show", "1"],
    ["jobs", "retry", "1"],
    ["jobs", "cancel", "1"],
    ["jobs", "purge", "--all", "--yes"],
    ["outbox", "relay", "-p", "log://", "--burst"],
    ["outbox", "status"],
    ["outbox", "list"],
    ["outbox", "show", "1"],
    ["outbox", "requeue", "1"],
    ["outbox", "discard", "1"],
    ["outbox", "purge", "--all", "--yes"],
]


def dibs(db: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DIBS_DATABASE_URL": db, "DIBS_CLI_TEST_OUT": os.devnull}
    return subprocess.run(
        [DIBS, *args], capture_output=True, stdin=subprocess.DEVNULL, text=True, timeout=60, cwd=ROOT, env=env
    )


def one_clear_line(result: subprocess.CompletedProcess[str], *hidden: str) -> str:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ")
    for secret in hidden:
        assert secret not in result.stderr + result.stdout
    return lines[0]


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("postgresql+psycopg//app:s3cret-pw@db.example/app", id="not a URL"),
        pytest.param("oracle+nodriver://app:s3cret-pw@db.example/app", id="unknown driver"),
        pytest.param("postgresql+psycopg://app:s3cret-pw@db.example:five/app", id="non-numeric port"),
    ],
)
@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(command[:2]) for command in COMMANDS])
def test_every_command_given_a_bad_database_url_says_so_without_its_password(url: str, command: list[str]) -> None:
    one_clear_line(dibs(url, *command), "s3cret-pw")
    one_clear_line(dibs("sqlite:///unused.sqlite", "--db", url, *command), "s3cret-pw")


@pytest.mark.parametrize("command", [["worker", MISSING_APP, "--burst"], ["enqueue", MISSING_APP, "greet"]])
def test_a_missing_app_module_is_one_clear_line(command: list[str], tmp_path: Path) -> None:
    line = one_clear_line(dibs(f"sqlite:///{tmp_path / 'x.sqlite'}", *command))
    assert "cannot import 'tests.acceptance.no_such_module'" in line


@pytest.mark.parametrize("args", ["not json", "[1, 2]", '{"name": '])
def test_a_bad_json_argument_is_one_clear_line(database: str, tmp_path: Path, args: str) -> None:
    assert dibs(database, "init").returncode == 0
    one_clear_line(dibs(database, "enqueue", APP, "greet", args))
