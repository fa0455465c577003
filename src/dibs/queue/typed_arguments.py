"""Typed arguments: task parameters annotated with dataclasses or pydantic models.

A parameter whose annotation names a dataclass or a pydantic model (alone, or inside ``list[...]``,
``dict[str, ...]``, ``X | None``) is validated and turned into JSON at enqueue, and rebuilt into the annotated
type in the worker before the call. Everything is worked out once, as the task is registered: the function's
type hints, and one shape per typed parameter. An annotation that involves a pydantic model is handled by a
pydantic ``TypeAdapter``, with every type pydantic knows; one made of dataclasses only is handled by dibs itself,
so that dataclasses need nothing installed: their fields may be str, int, float, bool, None, lists, dicts,
``X | None`` and other dataclasses, and fields of any other type are passed through as they are.

Parameters with other annotations (``int``, ``str``, ``dict``...) are not checked or converted: their values
must only be JSON, as for a task without annotations.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

#: The parameter a worker fills itself.
_CONTEXT = "context"
_PLAIN = (str, int, float, bool, type(None))


class Mismatch(ValueError):
    """A value that does not fit its annotation; the message says where and how."""


class Shape(Protocol):
    """How values of one annotation are checked, written as JSON, and rebuilt."""

    def dump(self, value: Any) -> Any:
        """``value`` checked and in its JSON form; Mismatch if it does not fit."""

    def load(self, value: Any) -> Any:
        """``value`` (JSON, or already of the type) rebuilt into the annotated type; Mismatch if it does not fit."""


def typed_parameters(function: Callable[..., Any], signature: inspect.Signature) -> dict[str, Shape]:
    """The shapes of ``function``'s parameters that are annotated with dataclasses or pydantic models.

    Raises:
        TypeError: pydantic cannot handle an annotation (the message says which and why).
    """
    hints = _hints(function, signature)
    shapes: dict[str, Shape] = {}
    for name, parameter in signature.parameters.items():
        if name == _CONTEXT or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        annotation = hints.get(name, inspect.Parameter.empty)
        kind = _kind(annotation, set())
        if kind == "pydantic":
            shapes[name] = _PydanticShape(annotation)
        elif kind == "dataclass":
            shapes[name] = _shape(annotation, {})
    return shapes


def label(annotation: Any) -> str:
    """An annotation as a reader writes it: ``Order``, ``list[Order]``."""
    return annotation.__qualname__ if isinstance(annotation, type) else repr(annotation).replace("typing.", "")


def _hints(function: Callable[..., Any], signature: inspect.Signature) -> dict[str, Any]:
    """The function's resolved annotations; one that cannot be resolved (a name imported only for type checkers)
    is left out, so that its parameter is passed as it is."""
    try:
        return typing.get_type_hints(function)
    except Exception:
        pass
    resolved: dict[str, Any] = {}
    namespace = getattr(function, "__globals__", {})
    for name, parameter in signature.parameters.items():
        annotation = parameter.annotation
        try:
            # A quoted annotation in a module with postponed annotations is a string of a string.
            while isinstance(annotation, str):
                annotation = eval(annotation, namespace)
        except Exception:
            continue
        resolved[name] = annotation
    return resolved


def _is_pydantic(annotation: Any) -> bool:
    # A pydantic model or dataclass can only exist once pydantic is imported: dibs never imports it itself.
    pydantic = sys.modules.get("pydantic")
    if pydantic is None or not isinstance(annotation, type):
        return False
    return issubclass(annotation, pydantic.BaseModel) or hasattr(annotation, "__pydantic_validator__")


def _kind(annotation: Any, seen: set[int]) -> str | None:
    """Which converts the annotation: "pydantic" when it involves a pydantic model, "dataclass" when it involves
    dataclasses only, None when it involves neither."""
    if id(annotation) in seen:
        return None
    seen.add(id(annotation))
    if _is_pydantic(annotation):
        return "pydantic"
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        inner = {_kind(hint, seen) for hint in _field_hints(annotation).values()}
        return "pydantic" if "pydantic" in inner else "dataclass"
    inner = {_kind(argument, seen) for argument in typing.get_args(annotation)}
    return "pydantic" if "pydantic" in inner else "dataclass" if "dataclass" in inner else None


def _field_hints(cls: type) -> dict[str, Any]:
    """The annotations of a dataclass's fields set by its constructor."""
    hints = typing.get_type_hints(cls)
    return {field.name: hints.get(field.name, Any) for field in dataclasses.fields(cls) if field.init}


class _PydanticShape:
    """An annotation that involves a pydantic model: a TypeAdapter, built once."""

    def __init__(self, annotation: Any) -> None:
        import pydantic

        try:
            self.adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(annotation)
        except pydantic.PydanticUserError as exc:
            raise TypeError(f"pydantic cannot validate {label(annotation)}: {exc}") from exc

    def dump(self, value: Any) -> Any:
        import pydantic
        import pydantic_core

        try:
            return self.adapter.dump_python(self.adapter.validate_python(value), mode="json")
        except pydantic.ValidationError as exc:
            raise Mismatch(_problems(exc)) from exc
        except pydantic_core.PydanticSerializationError as exc:
            raise Mismatch(f"it cannot be written as JSON: {exc}") from exc

    def load(self, value: Any) -> Any:
        import pydantic

        try:
            # Validated as the JSON it is stored as: a strict model takes a datetime or a UUID from JSON text,
            # but refuses the same text as a Python string.
            return self.adapter.validate_json(json.dumps(value))
        except pydantic.ValidationError as exc:
            raise Mismatch(_problems(exc)) from exc


def _problems(error: Any) -> str:
    """A pydantic ValidationError as one line: where, and what is wrong there."""
    return "; ".join(
        f"{'.'.join(str(part) for part in problem['loc']) or 'the value'}: {problem['msg']}"
        for problem in error.errors()
    )


def _shape(annotation: Any, made: dict[type, _DataclassShape]) -> Shape:
    """dibs's own shape of an annotation made of dataclasses and JSON types; ``made`` holds the dataclasses'
    shapes built so far (a dataclass may refer to itself)."""
    if annotation in _PLAIN or annotation is None:
        return _Plain(type(None) if annotation is None else annotation)
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        if annotation not in made:
            made[annotation] = shape = _DataclassShape(annotation)
            shape.fields = {name: _shape(hint, made) for name, hint in _field_hints(annotation).items()}
        return made[annotation]
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _shape(arguments[0], made)
    if origin in (typing.Union, types.UnionType):
        return _Union([_shape(member, made) for member in arguments])
    if origin in (list, Sequence, tuple) and arguments and (origin is not tuple or arguments[-1] is Ellipsis):
        return _ListOf(_shape(arguments[0], made), tuple if origin is tuple else list)
    if origin in (dict, Mapping) and len(arguments) == 2:
        return _DictOf(_shape(arguments[1], made))
    return _Anything()


class _Anything:
    """A type dibs does not convert: the value goes as it is (and must be JSON)."""

    def dump(self, value: Any) -> Any:
        return value

    def load(self, value: Any) -> Any:
        return value


class _Plain:
    """str, int, float, bool or None."""

    def __init__(self, kind: type) -> None:
        self.kind = kind

    def _checked(self, value: Any) -> Any:
        # bool is an int to Python but not to a reader of the annotation; an int is a fine float.
        kind = type(value)
        if not (
            kind is self.kind or (self.kind is float and kind is int) or (self.kind is str and isinstance(value, str))
        ):
            raise Mismatch(f"expected {label(self.kind).replace('NoneType', 'None')}, got {kind.__name__}")
        return float(value) if self.kind is float else value

    dump = load = _checked


class _Union:
    """``X | Y``: the first member the value fits."""

    def __init__(self, members: list[Shape]) -> None:
        self.members = members

    def _first(self, value: Any, how: str) -> Any:
        problems = []
        for member in self.members:
            try:
                return getattr(member, how)(value)
            except Mismatch as exc:
                problems.append(str(exc))
        raise Mismatch(" or ".join(problems))

    def dump(self, value: Any) -> Any:
        return self._first(value, "dump")

    def load(self, value: Any) -> Any:
        return self._first(value, "load")


class _ListOf:
    """``list[X]``, ``Sequence[X]`` or ``tuple[X, ...]``."""

    def __init__(self, item: Shape, kind: type) -> None:
        self.item = item
        self.kind = kind

    def _each(self, value: Any, how: Callable[[Shape, Any], Any]) -> list[Any]:
        if not isinstance(value, list | tuple):
            raise Mismatch(f"expected a list, got {type(value).__name__}")
        items = []
        for index, item in enumerate(value):
            try:
                items.append(how(self.item, item))
            except Mismatch as exc:
                raise Mismatch(f"[{index}]: {exc}") from None
        return items

    def dump(self, value: Any) -> Any:
        return self._each(value, lambda shape, item: shape.dump(item))

    def load(self, value: Any) -> Any:
        return self.kind(self._each(value, lambda shape, item: shape.load(item)))


class _DictOf:
    """``dict[str, X]``."""

    def __init__(self, item: Shape) -> None:
        self.item = item

    def _each(self, value: Any, how: Callable[[Shape, Any], Any]) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise Mismatch(f"expected a dict, got {type(value).__name__}")
        items = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise Mismatch(f"expected text keys, got {key!r}")
            try:
                items[key] = how(self.item, item)
            except Mismatch as exc:
                raise Mismatch(f"[{key!r}]: {exc}") from None
        return items

    def dump(self, value: Any) -> Any:
        return self._each(value, lambda shape, item: shape.dump(item))

    def load(self, value: Any) -> Any:
        return self._each(value, lambda shape, item: shape.load(item))


class _DataclassShape:
    """A dataclass: an instance, or a dict of its fields, whose values fit the fields' annotations."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.fields: dict[str, Shape] = {}
        self.required = frozenset(
            field.name
            for field in dataclasses.fields(cls)
            if field.init and field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        )

    def dump(self, value: Any) -> Any:
        if isinstance(value, Mapping):
            value = self.load(value)  # built, so that its constructor checks what it checks
        elif not isinstance(value, self.cls):
            raise Mismatch(f"expected a {self.cls.__name__} or a dict of its fields, got {type(value).__name__}")
        dumped = {}
        for name, shape in self.fields.items():
            try:
                dumped[name] = shape.dump(getattr(value, name))
            except Mismatch as exc:
                raise Mismatch(f"{name}: {exc}") from None
        return dumped

    def load(self, value: Any) -> Any:
        if isinstance(value, self.cls):
            return value
        name = self.cls.__name__
        if not isinstance(value, Mapping):
            raise Mismatch(f"expected a {name} or a dict of its fields, got {type(value).__name__}")
        unknown = sorted(set(value) - set(self.fields))
        missing = sorted(self.required - set(value))
        if unknown or missing:
            wrong = ", ".join([*(f"no field {key!r}" for key in unknown), *(f"{key!r} missing" for key in missing)])
            raise Mismatch(f"{name} takes the fields {', '.join(self.fields)}: {wrong}")
        built = {}
        for key, item in value.items():
            try:
                built[key] = self.fields[key].load(item)
            except Mismatch as exc:
                raise Mismatch(f"{key}: {exc}") from None
        try:
            return self.cls(**built)
        except (TypeError, ValueError) as exc:
            raise Mismatch(f"{name}: {exc}") from exc
