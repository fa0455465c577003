"""Every fenced code block of README.md and docs/, run as a reader who follows the page runs it.

The pages keep these conventions, and this test holds them to them:

- Every fence names its language. ``python`` blocks and shell blocks (``bash``, ``sh``, ``console``) are
  run; ``text``, ``ini``, ``yaml``, ``toml``, ``dockerfile``, ``sql`` and ``mermaid`` blocks are not code a
  reader runs (a unit file, a manifest, a statement shown, a diagram, output).
- Each page is one reader at work: its blocks run in order, in one fresh, empty directory of its own, with
  the page's environment (no ``$DIBS_DATABASE_URL`` until the page exports one, so dibs's default database
  is the file ``dibs.sqlite`` there).
- A block preceded by ``<!-- file: NAME -->`` is a file the reader saves: it is written to NAME in that
  directory (``tasks.py``, then imported by ``dibs worker tasks:app`` and by later blocks).
- Any other Python block is a script run with ``python`` in that directory; it fails the test when it
  exits non-zero or emits a warning a reader would see by default. A block preceded by
  ``<!-- continues -->`` carries on the script of the Python block before it: the two run as one
  script, at the place of the later one. Tracebacks carry the page's own line numbers. A block that
  starts a worker or a relay makes it end (``burst=True``).
- A shell block is read line by line (``\\`` joins lines, ``;`` separates commands, ``#`` starts a
  comment; in a ``console`` block only lines starting with ``$`` are commands, the rest is output):

  - ``dibs ...`` is parsed by the dibs command itself (its commands and options must exist, its values
    convert), then run, and must exit 0; a worker or relay without ``--burst`` runs until stopped, so
    it is only parsed.
  - ``export NAME=VALUE`` sets the page's environment. A ``DIBS_DATABASE_URL`` of PostgreSQL, MySQL or
    MariaDB is pointed at a fresh database of the page's own on the server the rest of the suite uses
    (``DIBS_TEST_POSTGRES_URL``, ``DIBS_TEST_MARIADB_URL``), with the page's driver; it is dropped after.
  - ``python FILE`` runs a file the page saved, as a Python block runs.
  - ``pip install NAME[EXTRAS]`` must name this distribution and extras that pyproject.toml declares.
  - ``scripts/NAME ...`` must be an executable script of this repository (they install packages and run
    for minutes; test_demo.py runs what scripts/demo runs).

  Any other program fails the test: teach this module about it, or show the block as ``text``.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.helpers.targets import MARIADB_URL, POSTGRES_URL, with_driver

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
DISTRIBUTION = "dibs-sql"
DIBS = str(Path(sys.executable).with_name("dibs"))
PARSE_ONLY = str(Path(__file__).with_name("docs_cli.py"))
PYTHON = {"python", "py"}
SHELL = {"bash", "sh", "shell", "console"}
NOT_CODE = {"text", "ini", "yaml", "toml", "dockerfile", "sql", "mermaid"}
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<language>[^\s`]*)")
MARKER = re.compile(r"^\s*<!--\s*(?P<kind>file|continues)\b:?\s*(?P<value>.*?)\s*-->\s*$")
# Warnings a reader sees by default when running a script; deprecations inside libraries stay hidden.
SHOWN_WARNINGS = ["-W", "error::UserWarning", "-W", "error::RuntimeWarning"]
STEP_SECONDS = 120
_databases = itertools.count(1)


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: str  #: the page's path from the repository root
    line: int  #: the page's line number of the opening fence
    language: str
    code: str
    file: str | None = None  #: the file name of a ``<!-- file: NAME -->`` block
    continues: bool = False  #: a ``<!-- continues -->`` Python block

    @property
    def where(self) -> str:
        return f"{self.page} line {self.line}"


def blocks_of(text: str, page: str = "page.md") -> list[Block]:
    """The fenced code blocks of a Markdown text, with their markers."""
    blocks: list[Block] = []
    lines = text.splitlines()
    number = 0
    while number < len(lines):
        opening = FENCE.match(lines[number])
        if opening is None:
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
        marker = MARKER.match(before)
        blocks.append(
            Block(
                page=page,
                line=number + 1,
                language=opening["language"].lower(),
                code="\n".join(body) + "\n",
                file=marker["value"] if marker and marker["kind"] == "file" else None,
                continues=bool(marker and marker["kind"] == "continues"),
            )
        )
        number = end + 1
    return blocks


def page_blocks(path: Path) -> list[Block]:
    return blocks_of(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))


ALL_BLOCKS = [block for page in PAGES for block in page_blocks(page)]


def tail(output: str, lines: int = 60) -> str:
    """The end of a long output, where a traceback says what went wrong."""
    every = output.splitlines()
    return "\n".join(every if len(every) <= lines else ["...", *every[-lines:]])


def shell_commands(block: Block) -> list[tuple[int, list[str]]]:
    """Each command of a shell block, with the page line it is on."""
    found: list[tuple[int, list[str]]] = []
    pending, first = "", 0
    for offset, line in enumerate(block.code.splitlines(), start=block.line + 1):
        if block.language == "console" and not pending:
            if not line.startswith("$"):
                continue  # output
            line = line[1:].lstrip()
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


@dataclass
class Reader:
    """A reader following one page: a directory, an environment, and databases made for the page."""

    directory: Path
    env: dict[str, str] = field(default_factory=dict)
    made: list[tuple[sa.URL, sa.URL]] = field(default_factory=list)  #: (the server's admin URL, a database)
    only_parsed: list[str] = field(default_factory=list)

    def run(self, argv: list[str], where: str) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                argv,
                cwd=self.directory,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=STEP_SECONDS,
                check=False,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"{where} did not end within {STEP_SECONDS} s; a worker or relay started in a page "
                "makes it end (burst=True, --burst)",
                pytrace=False,
            )

    def python(self, script: Path, where: str) -> None:
        result = self.run([sys.executable, *SHOWN_WARNINGS, str(script)], where)
        if result.returncode != 0:
            pytest.fail(
                f"{where} exited {result.returncode} (line numbers below are the page's):\n"
                f"{tail(result.stdout + result.stderr)}",
                pytrace=False,
            )

    def dibs(self, args: list[str], where: str) -> None:
        parsed = self.run([sys.executable, PARSE_ONLY, *args], where)
        if parsed.returncode != 0:
            pytest.fail(f"{where}: `dibs {shlex.join(args)}` does not parse:\n{parsed.stderr}", pytrace=False)
        reached = json.loads(parsed.stdout.strip().splitlines()[-1]) if parsed.stdout.strip() else {}
        if reached.get("why"):
            self.only_parsed.append(f"{where}: `dibs {shlex.join(args)}` only parsed: {reached['why']}")
            return
        result = self.run([DIBS, *args], where)
        if result.returncode != 0:
            pytest.fail(
                f"{where}: `dibs {shlex.join(args)}` exited {result.returncode}:\n"
                f"{tail(result.stdout + result.stderr)}",
                pytrace=False,
            )

    def export(self, assignment: str, where: str) -> None:
        name, equals, value = assignment.partition("=")
        assert equals, f"{where}: `export {assignment}` sets nothing"
        if name == "DIBS_DATABASE_URL" and not value.startswith("sqlite"):
            value = self.fresh_database(sa.make_url(value)).render_as_string(hide_password=False)
        self.env[name] = value

    def fresh_database(self, wanted: sa.URL) -> sa.URL:
        """A new, empty database like ``wanted`` on the server the suite tests against."""
        family = wanted.get_backend_name()
        server = sa.make_url(POSTGRES_URL if family == "postgresql" else MARIADB_URL)
        name = f"docs_{os.getpid()}_{next(_databases)}"
        quote = '"' if family == "postgresql" else "`"
        admin_driver = "postgresql+psycopg" if family == "postgresql" else "mysql+pymysql"
        admin_url = with_driver(server, admin_driver)
        admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {quote}{name}{quote}")
        admin.dispose()
        made = server.set(drivername=wanted.drivername, database=name)
        self.made.append((admin_url, made))
        return made

    def drop_databases(self) -> None:
        for admin_url, url in self.made:
            family = url.get_backend_name()
            admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                if family == "postgresql":
                    conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)')
                else:
                    conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{url.database}`")
            admin.dispose()


def check_pip(args: list[str], where: str) -> None:
    """A `pip install` names this distribution and extras it declares."""
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert args[:1] == ["install"], f"{where}: only `pip install` is checked, got `pip {shlex.join(args)}`"
    for spec in (arg for arg in args[1:] if not arg.startswith("-")):
        wanted = Requirement(spec)
        assert wanted.name == DISTRIBUTION, f"{where}: installs {wanted.name!r}, not {DISTRIBUTION!r}"
        unknown = wanted.extras - set(project.get("optional-dependencies", {}))
        assert not unknown, f"{where}: pyproject.toml declares no extra {sorted(unknown)}"


def run_shell(block: Block, reader: Reader) -> None:
    commands = shell_commands(block)
    assert commands, f"{block.where}: a shell block with no command in it"
    for line, (program, *args) in commands:
        where = f"{block.page} line {line}"
        if program == "dibs":
            reader.dibs(args, where)
        elif program == "export":
            for assignment in args:
                reader.export(assignment, where)
        elif program in {"python", "python3"} and args and args[0].endswith(".py"):
            reader.python(reader.directory / args[0], where)
        elif program == "pip":
            check_pip(args, where)
        elif program.startswith("scripts/"):
            script = ROOT / program
            assert script.is_file(), f"{where}: there is no {program} in the repository"
            assert os.access(script, os.X_OK), f"{where}: {program} is not executable"
        else:
            pytest.fail(
                f"{where}: the docs test does not know how to check `{program}`; teach "
                "tests/acceptance/test_docs.py, or show the block as text",
                pytrace=False,
            )


def scripts_in_order(blocks: list[Block]) -> Iterator[tuple[Block, str]]:
    """Each step of a page: a block, with the script it runs (Python blocks joined with their continuations)."""
    pending: list[Block] = []

    def joined() -> str:
        # Blank lines stand for the page's other lines, so that tracebacks give the page's line numbers.
        script, at = "", 0
        for part in pending:
            script += "\n" * (part.line - at) + part.code
            at = part.line + part.code.count("\n")
        return script

    for index, block in enumerate(blocks):
        if block.language in PYTHON and block.file is None:
            assert not block.continues or pending, f"{block.where}: continues no Python block before it"
            pending.append(block)
            following = blocks[index + 1] if index + 1 < len(blocks) else None
            if following is None or not following.continues:
                yield pending[-1], joined()
                pending = []
        else:
            yield block, ""


def reader_environment() -> dict[str, str]:
    """The environment of a reader who has not chosen a database: dibs's default, a file in the directory."""
    env = {name: value for name, value in os.environ.items() if name != "DIBS_DATABASE_URL"}
    env["COLUMNS"] = "200"
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.mark.parametrize("block", [pytest.param(block, id=block.where) for block in ALL_BLOCKS])
def test_every_block_names_a_language_this_test_knows(block: Block) -> None:
    known = sorted(PYTHON | SHELL | NOT_CODE)
    assert block.language in PYTHON | SHELL | NOT_CODE or block.file, (
        f"{block.where}: the fence names language {block.language!r}; name one of {known}, "
        "or teach tests/acceptance/test_docs.py to run it"
    )


def test_the_readme_and_the_docs_have_code_to_run() -> None:
    languages = {block.language for block in ALL_BLOCKS}
    assert languages & PYTHON, "no python block found: is the fence parser broken?"
    assert languages & SHELL, "no shell block found: is the fence parser broken?"
    assert len(PAGES) > 1, "no page found under docs/"


def run_page(blocks: list[Block], directory: Path) -> list[str]:
    """Follow a page's blocks in order in ``directory``; fails the test at the first block that fails.
    Returns the command lines that were only parsed, and why."""
    reader = Reader(directory, reader_environment())
    try:
        for block, script in scripts_in_order(blocks):
            if block.file is not None:
                target = directory / block.file
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(block.code, encoding="utf-8")
            elif block.language in PYTHON:
                path = directory / f".docs-block-{block.line}.py"
                path.write_text(script, encoding="utf-8")
                reader.python(path, block.where)
            elif block.language in SHELL:
                run_shell(block, reader)
    finally:
        reader.drop_databases()
    return reader.only_parsed


@pytest.mark.parametrize("page", [pytest.param(page, id=str(page.relative_to(ROOT))) for page in PAGES])
def test_page_runs_as_written(page: Path, tmp_path: Path) -> None:
    print("\n".join(run_page(page_blocks(page), tmp_path)))


FAILING = """\
<!-- file: tasks.py -->
```python
VALUE = 1
```

```python
from tasks import VALUE

assert VALUE == 2, "the page is wrong"
```
"""


def test_a_block_that_fails_fails_its_page(tmp_path: Path) -> None:
    # The fence is on line 6, the failing assert on line 9: tracebacks carry the page's line numbers.
    wanted = r"page\.md line 6 exited 1(.|\n)*line 9, in(.|\n)*the page is wrong"
    with pytest.raises(pytest.fail.Exception, match=wanted):
        run_page(blocks_of(FAILING), tmp_path)


def test_a_dibs_command_that_fails_fails_its_page(tmp_path: Path) -> None:
    page = "```bash\ndibs jobs show 1\n```\n"  # no such job: exit status 1
    with pytest.raises(pytest.fail.Exception, match=r"`dibs jobs show 1` exited 1"):
        run_page(blocks_of(page), tmp_path)


SAMPLE = """\
# Title

<!-- file: tasks.py -->
```python
x = 1
```

- a list item:

  ~~~console
  $ dibs init  # makes tables; not a second command
  created
  $ dibs jobs list --status dead ; dibs status \\
    --help
  ~~~

```python
a = 1
```

<!-- continues -->
```python
print(a)
```
"""


def test_blocks_are_read_with_their_markers_commands_and_continuations() -> None:
    saved, console, first, second = blocks_of(SAMPLE)
    assert (saved.line, saved.language, saved.file, saved.code) == (4, "python", "tasks.py", "x = 1\n")
    assert (console.line, console.language, console.file) == (10, "console", None)
    assert shell_commands(console) == [
        (11, ["dibs", "init"]),
        (13, ["dibs", "jobs", "list", "--status", "dead"]),
        (13, ["dibs", "status", "--help"]),
    ]
    assert second.continues
    assert not first.continues
    steps = list(scripts_in_order([saved, console, first, second]))
    assert [block.line for block, _ in steps] == [4, 10, 22]
    script = steps[-1][1]
    assert script.splitlines()[17] == "a = 1"
    assert script.splitlines()[22] == "print(a)"
