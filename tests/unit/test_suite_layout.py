"""The suite's own layout: fixtures come from one plugin, shared helpers from one package, and no conftest or
test module is imported by another module as a library.

A conftest that imports another conftest, or a test that imports fixtures from a conftest, registers the
same fixtures twice and ties test directories together; helpers in ``tests/helpers`` and fixtures in its
plugin keep every directory independent.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
#: The one package of what the suite shares, and its fixtures plugin.
HELPERS = "tests.helpers"
PLUGIN = "tests.helpers.fixtures"


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(TESTS.parent).with_suffix("").parts)


def imported(path: Path) -> Iterator[str]:
    """Every module ``path`` imports, wherever the import is."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def python_files() -> list[Path]:
    return sorted(TESTS.rglob("*.py"))


def is_conftest(name: str) -> bool:
    return name.rsplit(".", 1)[-1] == "conftest"


def is_test_module(name: str) -> bool:
    """Whether ``name`` is a test module of the suite (not a name inside a module that starts with test_)."""
    last = name.rsplit(".", 1)[-1]
    return last.startswith("test_") and TESTS.parent.joinpath(*name.split(".")).with_suffix(".py").exists()


def test_no_module_imports_a_conftest() -> None:
    found = [
        f"{module_name(path)} imports {name}"
        for path in python_files()
        for name in imported(path)
        if name.startswith("tests.") and is_conftest(name)
    ]
    assert found == []


def test_no_conftest_imports_a_test_module() -> None:
    found = [
        f"{module_name(path)} imports {name}"
        for path in python_files()
        if path.name == "conftest.py"
        for name in imported(path)
        if name.startswith("tests.") and is_test_module(name)
    ]
    assert found == []


def test_no_module_imports_a_test_module() -> None:
    # What two test modules share lives in a support module of their directory or in tests/helpers.
    found = [
        f"{module_name(path)} imports {name}"
        for path in python_files()
        for name in imported(path)
        if name.startswith("tests.") and is_test_module(name) and name != module_name(path)
    ]
    assert found == []


def test_the_root_conftest_registers_the_fixtures_plugin() -> None:
    tree = ast.parse((TESTS / "conftest.py").read_text())
    plugins = [
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytest_plugins" for t in node.targets)
    ]
    assert plugins, "the root conftest sets no pytest_plugins"
    assert PLUGIN in plugins[0]


def test_shared_helpers_live_in_the_helpers_package_only() -> None:
    # What tests/helpers holds (the targets, the harness, processes) is not defined a second time elsewhere.
    defined_twice = re.compile(r"^(def wait_until\b|BACKENDS\s*=|SYNC_DRIVERS\s*=|ASYNC_DRIVERS\s*=|class Harness\b)")
    found = [
        f"{module_name(path)}: {line.strip()}"
        for path in python_files()
        if not module_name(path).startswith(HELPERS)
        for line in path.read_text().splitlines()
        if defined_twice.match(line)
    ]
    assert found == []
    assert not [name for name in ("harness.py", "targets.py", "processes.py") if (TESTS / name).exists()]
