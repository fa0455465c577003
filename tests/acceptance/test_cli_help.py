"""Every command's help, as a user asks for it: -h and --help work, every option and argument is explained,
and no documentation markup leaks into the text."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator

import click
import pytest

import dibs
from dibs.cli.group import command
from tests.acceptance.cli import DIBS, ROOT

#: reST roles (:class:`x`), inline literals (``x``) and references (`x`_), none of which a terminal renders.
MARKUP = re.compile(r"``|:[a-z]+:`|`_\b|`[^`\s]+`_")


def commands(
    group: click.Group = command, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    yield path, group
    for name, sub in group.commands.items():
        if isinstance(sub, click.Group):
            yield from commands(sub, (*path, name))
        else:
            yield (*path, name), sub


EVERY_COMMAND = sorted(commands(), key=lambda found: found[0])


def test_the_walk_finds_every_command() -> None:
    names = {" ".join(path) for path, _ in EVERY_COMMAND}
    assert {"", "worker", "enqueue", "jobs show", "jobs purge", "outbox show", "outbox purge", "outbox relay"} <= names


@pytest.mark.parametrize(("path", "cmd"), EVERY_COMMAND, ids=[" ".join(path) or "dibs" for path, _ in EVERY_COMMAND])
def test_every_command_explains_itself_without_markup(path: tuple[str, ...], cmd: click.Command) -> None:
    short = subprocess.run([DIBS, *path, "-h"], capture_output=True, text=True, timeout=30, check=False, cwd=ROOT)
    long = subprocess.run([DIBS, *path, "--help"], capture_output=True, text=True, timeout=30, check=False, cwd=ROOT)
    assert short.returncode == 0, short.stderr
    assert short.stdout == long.stdout
    text = short.stdout
    assert not MARKUP.search(text), f"markup in `dibs {' '.join(path)} --help`: {MARKUP.search(text)}"
    assert "Traceback" not in short.stderr
    assert (cmd.help or "").strip(), f"dibs {' '.join(path)} has no help text"
    for param in cmd.params:
        if isinstance(param, click.Option):
            assert (param.help or "").strip(), f"option {param.opts} of dibs {' '.join(path)} has no help"
        else:
            name = param.human_readable_name.strip("[].")
            assert name in (cmd.help or ""), f"argument {name} of dibs {' '.join(path)} is not explained"


def test_version() -> None:
    for flag in ("--version", "-V"):
        shown = subprocess.run([DIBS, flag], capture_output=True, text=True, timeout=30, check=False, cwd=ROOT)
        assert shown.returncode == 0
        assert shown.stdout.strip() == f"dibs {dibs.__version__}"
