"""The documentation site builds with ``mkdocs build --strict``, every page of its nav is built, and the
reference pages name every public name, command, option and column that the code has."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

import dibs
from dibs.cli.group import command
from dibs.schema import metadata

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference"
BUILD_SECONDS = 240


class _ConfigLoader(yaml.SafeLoader):
    """Reads mkdocs.yml, whose ``!!python/name:`` tags need not be resolved to read the nav."""


_ConfigLoader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: suffix)


def nav_pages(nav: Any) -> Iterator[str]:
    """Every page file the nav names, however deep."""
    if isinstance(nav, str):
        yield nav
    elif isinstance(nav, list):
        for item in nav:
            yield from nav_pages(item)
    elif isinstance(nav, dict):
        for value in nav.values():
            yield from nav_pages(value)


def built_path(site: Path, page: str) -> Path:
    """Where mkdocs writes a page with directory URLs: a/b.md -> a/b/index.html, a/index.md -> a/index.html."""
    stem = page.removesuffix(".md")
    if stem == "index" or stem.endswith("/index"):
        return site / f"{stem}.html"
    return site / stem / "index.html"


def section(page: Path, heading: str) -> str:
    """The text of a page under ``heading`` (``## Title``) up to the next heading of that level or above."""
    level = len(heading) - len(heading.lstrip("#"))
    text = page.read_text(encoding="utf-8")
    pattern = rf"^{re.escape(heading)}\s*$(.*?)(?=^#{{1,{level}}} |\Z)"
    match = re.search(pattern, text, re.MULTILINE | re.DOTALL)
    assert match, f"{page.relative_to(ROOT)} has no section '{heading}'"
    return match.group(1)


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_ConfigLoader)
    return loaded


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=BUILD_SECONDS,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"mkdocs build --strict failed:\n{result.stdout[-4000:]}{result.stderr[-8000:]}", pytrace=False)
    return site


def test_every_nav_page_is_built(config: dict[str, Any], site: Path) -> None:
    pages = list(nav_pages(config["nav"]))
    assert len(pages) == len(set(pages)), "a page appears twice in the nav"
    missing = [page for page in pages if not built_path(site, page).is_file()]
    assert not missing, f"pages in the nav that the build did not write: {missing}"


def api_paths() -> list[str]:
    """The dotted paths reference/api.md documents (``dibs.App``; ``dibs.claim.claim`` where a module has
    the name of the function)."""
    api = (REFERENCE / "api.md").read_text(encoding="utf-8")
    return re.findall(r"^::: (dibs(?:\.\w+)+)\s*$", api, re.MULTILINE)


def test_api_reference_documents_every_public_name() -> None:
    documented = [path.rsplit(".", 1)[1] for path in api_paths()]
    assert len(documented) == len(set(documented)), "a name is documented twice in reference/api.md"
    assert set(documented) == set(dibs.__all__), (
        f"reference/api.md lacks {sorted(set(dibs.__all__) - set(documented))}, "
        f"names what is not public: {sorted(set(documented) - set(dibs.__all__))}"
    )
    for path in api_paths():
        module, name = path.rsplit(".", 1)
        assert getattr(importlib.import_module(module), name) is getattr(dibs, name), f"{path} is not dibs.{name}"


def test_api_reference_renders_each_name(site: Path) -> None:
    html = built_path(site, "reference/api.md").read_text(encoding="utf-8")
    absent = [path for path in api_paths() if f'id="{path}"' not in html]
    assert not absent, f"reference/api.md built no section for {absent}"
    # A module in place of the function of its name would document its private helpers too.
    assert 'id="dibs.claim.run_claim"' not in html, "reference/api.md documents the module dibs.claim"


def commands(group: click.Command, path: str = "dibs") -> Iterator[str]:
    """The anchor of every command under the group, as mkdocs-click makes them."""
    yield path.replace(" ", "-")
    if isinstance(group, click.Group):
        for name, sub in group.commands.items():
            yield from commands(sub, f"{path} {name}")


def test_cli_reference_documents_every_command(site: Path) -> None:
    html = built_path(site, "reference/cli.md").read_text(encoding="utf-8")
    absent = [anchor for anchor in commands(command) if f'id="{anchor}"' not in html]
    assert not absent, f"reference/cli.md built no section for {absent}"


@pytest.mark.parametrize(
    ("heading", "what"),
    [
        ("## `App`", dibs.App),
        ("### `@app.task`", dibs.App.task),
        ("### `@app.periodic`", dibs.App.periodic),
        ("### `Retry`", dibs.Retry),
        ("## `Worker`", dibs.Worker),
        ("## `Outbox`", dibs.Outbox),
        ("## `Relay`", dibs.Relay),
        ("## `Leases`", dibs.Leases),
        ("## `DueScheduler`", dibs.DueScheduler),
    ],
)
def test_configuration_names_every_option(heading: str, what: Any) -> None:
    text = section(REFERENCE / "configuration.md", heading)
    skipped = (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    options = [
        name
        for name, parameter in inspect.signature(what).parameters.items()
        if name not in ("self", "function", "app", "outbox", "table") and parameter.kind not in skipped
    ]
    absent = [name for name in options if f"`{name}`" not in text]
    assert not absent, f"reference/configuration.md, {heading}: no row for {absent}"


def test_configuration_names_the_environment_variable() -> None:
    assert "`DIBS_DATABASE_URL`" in section(REFERENCE / "configuration.md", "## Environment")


@pytest.mark.parametrize("table", sorted(metadata.tables.values(), key=lambda table: table.name), ids=str)
def test_tables_reference_names_every_column_and_index(table: Any) -> None:
    text = section(REFERENCE / "tables.md", f"## `{table.name}`")
    columns = [column.name for column in table.columns if f"| `{column.name}` |" not in text]
    indexes = [index.name for index in table.indexes if not index.name.endswith("_full")]
    absent = [name for name in indexes if f"`{name}`" not in text]
    assert not columns, f"reference/tables.md, {table.name}: no row for the columns {columns}"
    assert not absent, f"reference/tables.md, {table.name}: no row for the indexes {absent}"


def test_errors_reference_names_every_error() -> None:
    text = (REFERENCE / "errors.md").read_text(encoding="utf-8")
    errors = [
        name
        for name in dibs.__all__
        if isinstance(getattr(dibs, name), type) and issubclass(getattr(dibs, name), (dibs.DibsError, dibs.DibsWarning))
    ]
    absent = [name for name in errors if f"| `{name}` |" not in text]
    assert not absent, f"reference/errors.md has no row saying what to do about {absent}"


def complete_runs() -> list[Path]:
    """The runner's result files that hold every part the page opens with, oldest first (their names sort by
    time). The enqueue part is quoted from its own result file until a complete run holds it too."""
    from benchmarks.__main__ import PARTS

    quoted = set(PARTS) - {"enqueue"}
    runs = sorted((ROOT / "benchmarks" / "results").glob("run-*.json"))
    return [path for path in runs if quoted <= set(json.loads(path.read_text(encoding="utf-8"))["parts"])]


def test_performance_page_shows_the_newest_complete_run() -> None:
    # The runner writes results and redraws the plots but not the page: a new run must be quoted by hand.
    newest = complete_runs()[-1].name
    page = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    assert newest in page.split("\n## ")[0], f"docs/benchmarks.md should open with the newest complete run, {newest}"


def test_benchmark_history_lists_every_result_file() -> None:
    lines = (DOCS / "benchmarks" / "history.md").read_text(encoding="utf-8").splitlines()
    listed = [match.group(1) for line in lines if (match := re.match(r"- `([^`]+\.json)`", line))]
    kept = sorted(path.name for path in (ROOT / "benchmarks" / "results").glob("*.json"))
    assert sorted(listed) == kept, (
        f"docs/benchmarks/history.md lacks {sorted(set(kept) - set(listed))}, "
        f"lists files that are gone or twice: {sorted(set(listed) - set(kept)) or 'none'}"
    )
