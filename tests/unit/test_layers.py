"""The import graph of dibs: no circles between modules, no module importing a layer above its own, and the
queue, the outbox and the due scheduler independent of each other.

A circle among the imports that run when a module is loaded (not those inside functions, which run later, nor
those under ``if TYPE_CHECKING:``, which never do) breaks an import; one dodged by moving an import into a
function still tangles the design, so each check also runs on every import, wherever it is.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import dibs

ROOT = Path(dibs.__file__).parent

#: The layers of dibs, lowest first, by module or package: a module imports its own layer and those below it.
LAYERS = (
    ("dibs._errors", "dibs._checks"),
    ("dibs.dialects",),
    ("dibs.engine", "dibs.schema", "dibs.retry", "dibs.metrics", "dibs.tracing"),
    ("dibs.claim", "dibs.lease", "dibs.runtime"),
    ("dibs.due", "dibs.queue", "dibs.outbox"),
    ("dibs", "dibs.cli", "dibs.dashboard", "dibs.demo", "dibs.alembic", "dibs.django", "dibs.testing"),
)
#: Services on the same layer that know nothing of each other.
INDEPENDENT = ("dibs.due", "dibs.queue", "dibs.outbox")


@dataclass(frozen=True)
class Module:
    name: str
    path: Path

    @property
    def package(self) -> str:
        """The package relative imports start from."""
        return self.name if self.path.name == "__init__.py" else self.name.rpartition(".")[0]


def modules() -> dict[str, Module]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = ["dibs", *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = Module(".".join(parts), path)
    return found


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def statements(body: list[ast.stmt], everywhere: bool) -> Iterator[ast.stmt]:
    """The statements of a body, and of the blocks in it that run with it (every block if ``everywhere``)."""
    for node in body:
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and not everywhere:
            continue
        if isinstance(node, ast.If) and is_type_checking(node.test) and not everywhere:
            yield from statements(node.orelse, everywhere)
            continue
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            for child in getattr(node, field, []):
                if isinstance(child, (ast.ExceptHandler, ast.match_case)):
                    yield from statements(child.body, everywhere)
                elif isinstance(child, ast.stmt):
                    yield from statements([child], everywhere)


def imported(module: Module, everywhere: bool = False) -> set[str]:
    """The names ``module`` imports: modules, and for ``from x import y`` both ``x`` and ``x.y``."""
    names = set()
    tree = ast.parse(module.path.read_text(), str(module.path))
    for node in statements(tree.body, everywhere):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.package.split(".")[: len(module.package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names)
    return names


def graph(everywhere: bool = False) -> dict[str, set[str]]:
    """Each dibs module and the dibs modules loading it loads: what it names and their packages, except the
    packages it is part of (they are already loading when it is)."""
    known = modules()
    edges: dict[str, set[str]] = {}
    for name, module in known.items():
        targets = set()
        for imported_name in imported(module, everywhere):
            parts = imported_name.split(".")
            for end in range(1, len(parts) + 1):
                target = ".".join(parts[:end])
                if target in known and target != name and not name.startswith(target + "."):
                    targets.add(target)
        edges[name] = targets
    return edges


def circle(edges: dict[str, set[str]]) -> list[str] | None:
    """One circle in the graph, as the modules along it; None when there is none."""
    done: set[str] = set()
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        if name in path:
            return [*path[path.index(name) :], name]
        if name in done:
            return None
        path.append(name)
        for target in sorted(edges[name]):
            if found := visit(target):
                return found
        path.pop()
        done.add(name)
        return None

    for name in sorted(edges):
        if found := visit(name):
            return found
    return None


def test_the_graph_finds_a_circle_when_there_is_one() -> None:
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_imports_in_functions_and_under_type_checking_are_not_loaded_with_the_module(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import near\n"
        "if TYPE_CHECKING:\n    import typed\nelse:\n    import untyped\n"
        "try:\n    import tried\nexcept ImportError:\n    import fallback\n"
        "class C:\n    import in_class\n"
        "def f():\n    import later\n"
    )
    module = Module("dibs.pkg.m", source)
    assert imported(module) == {"typing", "typing.TYPE_CHECKING", "dibs.pkg", "dibs.pkg.near"} | {
        "untyped",
        "tried",
        "fallback",
        "in_class",
    }
    assert {"typed", "later"} <= imported(module, everywhere=True)


@pytest.mark.parametrize("imports_at", ["load", "anywhere"])
def test_no_module_of_dibs_imports_itself_in_a_circle(imports_at: str) -> None:
    edges = graph(everywhere=imports_at == "anywhere")
    assert "dibs.queue.app" in edges["dibs.queue"]  # the graph sees the package as it is
    found = circle(edges)
    assert found is None, "import circle: " + " -> ".join(found or [])


def part_of(name: str, entries: tuple[str, ...]) -> str | None:
    """The entry ``name`` is or is inside (the longest, so ``dibs`` holds only the root module)."""
    inside = [entry for entry in entries if name == entry or (entry != "dibs" and name.startswith(entry + "."))]
    return max(inside, key=len, default=None)


def layer_of(name: str) -> int:
    for number, entries in enumerate(LAYERS):
        if part_of(name, entries):
            return number
    raise AssertionError(f"{name} is in no layer: add it to LAYERS in {__file__}")


@pytest.mark.parametrize("imports_at", ["load", "anywhere"])
def test_no_module_imports_a_layer_above_its_own(imports_at: str) -> None:
    edges = graph(everywhere=imports_at == "anywhere")
    wrong = sorted(
        f"{name} imports {target}"
        for name, targets in edges.items()
        for target in targets
        if layer_of(target) > layer_of(name)
    )
    assert wrong == []


@pytest.mark.parametrize("imports_at", ["load", "anywhere"])
def test_the_queue_the_outbox_and_the_due_scheduler_import_nothing_of_each_other(imports_at: str) -> None:
    edges = graph(everywhere=imports_at == "anywhere")
    wrong = sorted(
        f"{name} imports {target}"
        for name, targets in edges.items()
        for target in targets
        if part_of(name, INDEPENDENT) and part_of(target, INDEPENDENT) not in (None, part_of(name, INDEPENDENT))
    )
    assert wrong == []
