"""Which parameters are typed, and how their values are checked, written as JSON and rebuilt: worked out once per
task, from the function's annotations alone."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Optional

import pydantic
import pytest

from dibs.queue.typed_arguments import Mismatch, Shape, typed_parameters

if TYPE_CHECKING:
    from decimal import Decimal


@dataclass
class Point:
    x: float
    y: float = 0.0

    def __post_init__(self) -> None:
        if self.x < 0:
            raise ValueError("x must not be negative")


@dataclass
class Tree:
    label: str
    children: list[Tree] = field(default_factory=list)
    weights: dict[str, int] = field(default_factory=dict)
    extra: Any = None


class Box(pydantic.BaseModel):
    corner: Point
    size: int


def shapes(function: Callable[..., Any]) -> dict[str, Shape]:
    return typed_parameters(function, inspect.signature(function))


def test_only_parameters_that_involve_a_dataclass_or_a_model_are_typed() -> None:
    def task(
        point: Point,
        maybe: Optional[Point],  # noqa: UP045
        many: Sequence[Annotated[Point, "why"]],
        box: Box | None,
        count: int,
        data: dict[str, Any],
        unknown: Decimal,
        context: Point,
        *rest: Point,
        **more: Point,
    ) -> None: ...

    assert sorted(shapes(task)) == ["box", "many", "maybe", "point"]


def test_a_dataclass_takes_an_instance_or_a_dict_and_is_written_as_its_fields() -> None:
    (point,) = shapes(_takes_point).values()
    assert point.dump(Point(1.5)) == {"x": 1.5, "y": 0.0}
    assert point.dump({"x": 2}) == {"x": 2.0, "y": 0.0}
    assert point.load({"x": 2, "y": 3}) == Point(2.0, 3.0)
    with pytest.raises(Mismatch, match="x: expected float, got str"):
        point.dump({"x": "2"})
    with pytest.raises(Mismatch, match="x: expected float, got bool"):
        point.dump(Point(True))  # dataclasses do not check their fields: dibs does
    with pytest.raises(Mismatch, match="Point takes the fields x, y: no field 'z', 'x' missing"):
        point.dump({"z": 1})
    with pytest.raises(Mismatch, match="Point: x must not be negative"):
        point.dump({"x": -1})
    with pytest.raises(Mismatch, match="expected a Point or a dict of its fields, got list"):
        point.load([1, 2])


def _takes_point(point: Point) -> None: ...


def test_nested_and_recursive_dataclasses_say_where_a_value_is_wrong() -> None:
    def task(tree: Tree) -> None: ...

    (tree,) = shapes(task).values()
    nested = {"label": "a", "children": [{"label": "b", "weights": {"w": 1}, "extra": {"any": [1]}}]}
    rebuilt = tree.load(tree.dump(nested))
    assert rebuilt == Tree("a", [Tree("b", weights={"w": 1}, extra={"any": [1]})])
    with pytest.raises(Mismatch, match=r"children: \[0\]: weights: \['w'\]: expected int, got float"):
        tree.dump({"label": "a", "children": [{"label": "b", "weights": {"w": 1.5}}]})


def test_a_model_is_validated_by_pydantic_with_its_own_conversions() -> None:
    def task(box: Box, boxes: list[Box] | None = None) -> None: ...

    typed = shapes(task)
    assert typed["box"].dump({"corner": Point(1), "size": "3"}) == {"corner": {"x": 1.0, "y": 0.0}, "size": 3}
    assert typed["boxes"].load([{"corner": {"x": 1}, "size": 2}]) == [Box(corner=Point(1), size=2)]
    assert typed["boxes"].dump(None) is None
    with pytest.raises(Mismatch, match="size: Input should be a valid integer"):
        typed["box"].dump({"corner": {"x": 1}, "size": "big"})


def test_a_union_takes_the_first_member_the_value_fits() -> None:
    def task(either: Point | Tree | None) -> None: ...

    (either,) = shapes(task).values()
    assert either.load({"label": "t"}) == Tree("t")
    assert either.load(None) is None
    with pytest.raises(Mismatch, match=r"expected a Point .* or expected a Tree .* or expected None, got int"):
        either.dump(3)


def test_an_annotation_that_cannot_be_resolved_leaves_its_parameter_as_it_is() -> None:
    namespace: dict[str, Any] = {"Point": Point}
    exec("def task(point: 'Point', later: 'NotImportedHere') -> None: ...", namespace)
    assert sorted(shapes(namespace["task"])) == ["point"]
