"""Every fenced code block of README.md, run as a reader who pastes it runs it.

The README keeps these conventions, and this test holds it to them:

- Every fence names its language: ``python`` and ``sh`` blocks are run; ``text`` blocks are not code.
- A Python block is self-contained: it imports and defines everything it uses. It is run alone with
  ``python`` in a fresh, empty directory, without ``$DIBS_DATABASE_URL`` (the default database is then the
  file ``dibs.sqlite`` there), and fails when it exits non-zero or emits a warning a reader would see by
  default (dibs's warnings are ``UserWarning``\\s; a ``RuntimeWarning`` too). Its traceback's line numbers
  are README.md's. A block that starts a worker or a relay makes it end (``burst=True``). Examples use
  SQLite files, dibs's embedded default: the calls are the same on every database, and the rest of the
  suite makes them on PostgreSQL and MariaDB. Brokers (Redis, NATS, RabbitMQ) are used at their default
  local ports.
- A shell block is read line by line (``\\`` joins lines, ``;`` separates commands, ``#`` starts a
  comment) in a fresh directory where ``dibs init`` has made the default database, as a reader has done:

  - ``dibs ...`` is parsed by the dibs command itself (its commands and options must exist, its values
    convert), then run; it must exit 0. Only parsed are the lines that cannot run there: a worker or a
    relay without ``--burst`` (it runs until stopped), a command given the reader's app module (``APP``)
    or ids of the reader's jobs or events (see readme_cli.py).
  - ``pip install NAME[EXTRAS]`` must name this distribution and extras that pyproject.toml declares.
  - ``scripts/NAME ...`` must be an executable script of this repository. They install packages and run
    for minutes (the whole suite, the benchmarks); test_demo.py runs what scripts/demo runs.

  Any other program fails the test: teach this module about it, or mark the block.
- A block that cannot run as written is marked on the line before its fence with
  ``<!-- not run: the reason -->``; it is reported as a skip, with the reason, in pytest's summary.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DIBS = str(Path(sys.executable).with_name("dibs"))
PARSE_ONLY = str(Path(__file__).with_name("readme_cli.py"))
PYTHON = {"python", "py"}
SHELL = {"sh", "bash", "shell"}
NOT_CODE = {"text"}
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<language>[^\s`]*)")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(?P<why>.*?)\s*-->\s*$")
HEADING = re.compile(r"^#{1,6}\s+(?P<title>.+?)\s*#*\s*$")
# Warnings a reader sees by default when running a script; deprecations inside libraries stay hidden.
SHOWN_WARNINGS = ["-W", "error::UserWarning", "-W", "error::RuntimeWarning"]
BLOCK_SECONDS = 120


@dataclass(frozen=True)
class Block:
    """One fenced code block of the README."""

    section: str
    line: int  #: README.md's line number of the opening fence
    language: str
    code: str
    not_run: str | None  #: the reason given in a ``<!-- not run: ... -->`` marker, if any

    @property
    def id(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.section.lower()).strip("-")
        return f"{slug}-L{self.line}"

    @property
    def where(self) -> str:
        return f"README.md line {self.line} (section {self.section!r})"


def readme_blocks(text: str) -> list[Block]:
    """The fenced code blocks of a Markdown text, with the section each is in."""
    blocks: list[Block] = []
    lines = text.splitlines()
    section, number = "top", 0
    while number < len(lines):
        line = lines[number]
        opening = FENCE.match(line)
        if opening is None:
            heading = HEADING.match(line)
            if heading is not None:
                section = heading["title"]
            number += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        closing = re.compile(rf"^ *{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        end = number + 1
        while end < len(lines) and not closing.match(lines[end]):
            end += 1
        # A fence indented in a list item indents its code as much; a line indented less loses what it has.
        body = [row[indent:] if row.startswith(" " * indent) else row.lstrip() for row in lines[number + 1 : end]]
        before = next((lines[i] for i in range(number - 1, -1, -1) if lines[i].strip()), "")
        marker = NOT_RUN.match(before)
        blocks.append(
            Block(
                section=section,
                line=number + 1,
                language=opening["language"].lower(),
                code="\n".join(body) + "\n",
                not_run=marker["why"] if marker else None,
            )
        )
        number = end + 1
    return blocks


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))


def cases(languages: set[str]) -> list[object]:
    return [
        pytest.param(
            block,
            id=block.id,
            marks=[pytest.mark.skip(reason=f"{block.where}: not run: {block.not_run}")] if block.not_run else [],
        )
        for block in BLOCKS
        if block.language in languages
    ]


def tail(output: str, lines: int = 60) -> str:
    """The end of a long output, where a traceback says what went wrong."""
    every = output.splitlines()
    return "\n".join(every if len(every) <= lines else ["...", *every[-lines:]])


def reader_environment() -> dict[str, str]:
    """The environment of a reader who has not chosen a database: dibs's default, a file in the directory."""
    env = {name: value for name, value in os.environ.items() if name != "DIBS_DATABASE_URL"}
    env["COLUMNS"] = "200"
    return env


def test_the_readme_has_python_and_shell_blocks() -> None:
    languages = {block.language for block in BLOCKS}
    assert languages & PYTHON, "no python block found in README.md: is the fence parser broken?"
    assert languages & SHELL, "no sh block found in README.md: is the fence parser broken?"


@pytest.mark.parametrize("block", [pytest.param(block, id=block.id) for block in BLOCKS])
def test_every_block_names_a_language_this_test_knows(block: Block) -> None:
    known = sorted(PYTHON | SHELL | NOT_CODE)
    assert block.language in PYTHON | SHELL | NOT_CODE, (
        f"{block.where}: the fence names language {block.language!r}; name one of {known} "
        "(text for what is not code), or teach tests/acceptance/test_readme.py to run it"
    )


@pytest.mark.parametrize("block", cases(PYTHON))
def test_python_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    script = tmp_path / "readme_block.py"
    # Blank lines before the code make the traceback's line numbers README.md's.
    script.write_text("\n" * block.line + block.code, encoding="utf-8")
    try:
        result = subprocess.run(
            [sys.executable, *SHOWN_WARNINGS, str(script)],
            cwd=tmp_path,
            env=reader_environment(),
            capture_output=True,
            text=True,
            timeout=BLOCK_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        result = None
    if result is None:
        pytest.fail(
            f"{block.where} did not end within {BLOCK_SECONDS} s; a block that starts a worker or a relay "
            "makes it end (burst=True)",
            pytrace=False,
        )
    if result.returncode != 0:
        pytest.fail(
            f"{block.where} exited {result.returncode} (line numbers below are README.md's):\n"
            f"{tail(result.stdout + result.stderr)}",
            pytrace=False,
        )


def shell_commands(block: Block) -> list[tuple[int, list[str]]]:
    """Each command of a shell block, with the README line it is on."""
    found: list[tuple[int, list[str]]] = []
    pending, first = "", 0
    for offset, line in enumerate(block.code.splitlines(), start=block.line + 1):
        if not pending:
            first = offset
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lexer = shlex.shlex(pending + line, posix=True, punctuation_chars=";")
        lexer.whitespace_split = True
        pending = ""
        command: list[str] = []
        for token in [*lexer, ";"]:
            if token.strip(";"):
                command.append(token)
            elif command:
                found.append((first, command))
                command = []
    return found


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env=reader_environment(), capture_output=True, text=True, timeout=60, check=False
    )


def check_dibs(args: list[str], cwd: Path, where: str) -> str | None:
    """Parse a dibs command line, and run it where it can run; returns why it was only parsed."""
    parsed = run([sys.executable, PARSE_ONLY, *args], cwd)
    if parsed.returncode != 0:
        pytest.fail(f"{where}: `dibs {shlex.join(args)}` does not parse:\n{parsed.stderr}", pytrace=False)
    reached = json.loads(parsed.stdout.strip().splitlines()[-1]) if parsed.stdout.strip() else {}
    if reached.get("why"):
        return str(reached["why"])
    result = run([DIBS, *args], cwd)
    if result.returncode != 0:
        pytest.fail(
            f"{where}: `dibs {shlex.join(args)}` exited {result.returncode}:\n{tail(result.stdout + result.stderr)}",
            pytrace=False,
        )
    return None


def check_pip(args: list[str], where: str) -> None:
    """A `pip install` names this distribution and extras it declares."""
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert args[:1] == ["install"], f"{where}: only `pip install` is checked, got `pip {shlex.join(args)}`"
    for spec in (arg for arg in args[1:] if not arg.startswith("-")):
        wanted = Requirement(spec)
        assert wanted.name == project["name"], f"{where}: installs {wanted.name!r}, not {project['name']!r}"
        unknown = wanted.extras - set(project.get("optional-dependencies", {}))
        assert not unknown, f"{where}: pyproject.toml declares no extra {sorted(unknown)}"


@pytest.mark.parametrize("block", cases(SHELL))
def test_shell_block_runs_or_parses_as_written(block: Block, tmp_path: Path) -> None:
    commands = shell_commands(block)
    assert commands, f"{block.where}: a shell block with no command in it"
    if any(program == "dibs" for _, (program, *_) in commands):
        init = run([DIBS, "init"], tmp_path)
        assert init.returncode == 0, f"dibs init failed before the block ran:\n{init.stdout}{init.stderr}"
    only_parsed = []
    for line, (program, *args) in commands:
        where = f"README.md line {line}"
        if program == "dibs":
            why = check_dibs(args, tmp_path, where)
            if why:
                only_parsed.append(f"{where}: `dibs {shlex.join(args)}` only parsed: {why}")
        elif program == "pip":
            check_pip(args, where)
        elif program.startswith("scripts/"):
            script = ROOT / program
            assert script.is_file(), f"{where}: there is no {program} in the repository"
            assert os.access(script, os.X_OK), f"{where}: {program} is not executable"
        else:
            pytest.fail(
                f"{where}: the README test does not know how to check `{program}`; teach "
                "tests/acceptance/test_readme.py, or mark the block with <!-- not run: why -->",
                pytrace=False,
            )
    print("\n".join(only_parsed))


SAMPLE = """\
# Title

## First part

<!-- not run: needs a thing -->
```python
print(1)
```

- a list item:

  ~~~sh
  dibs init  # makes tables; not a second command
  dibs jobs list --status dead ; dibs status \\
    --help
  ~~~
"""


def test_blocks_are_read_with_their_section_line_marker_and_commands() -> None:
    first, second = readme_blocks(SAMPLE)
    assert (first.section, first.line, first.language, first.code) == ("First part", 6, "python", "print(1)\n")
    assert first.not_run == "needs a thing"
    assert first.id == "first-part-L6"
    assert (second.line, second.language, second.not_run) == (12, "sh", None)
    assert shell_commands(second) == [
        (13, ["dibs", "init"]),
        (14, ["dibs", "jobs", "list", "--status", "dead"]),
        (14, ["dibs", "status", "--help"]),
    ]
