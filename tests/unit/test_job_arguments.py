"""A job's stored arguments are decoded one way, whatever they are: a JSON object is the arguments, and
anything else is described for the error that buries the job."""

from __future__ import annotations

import json

from dibs.queue.execute import decoded


def test_an_empty_object_is_no_arguments() -> None:
    assert decoded("{}") == {}
    assert decoded(" { } ") == {}


def test_an_object_is_the_arguments_by_name() -> None:
    assert decoded('{"to": "ada", "times": 2}') == {"to": "ada", "times": 2}


def test_json_that_is_not_an_object_is_described() -> None:
    assert decoded("[1, 2]") == "are not a JSON object of argument names but a list"
    assert decoded("null") == "are not a JSON object of argument names but null"


def test_text_that_is_not_json_is_described() -> None:
    assert decoded("{oops").startswith("are not valid JSON (")


def test_arguments_decode_as_json_loads_decodes_them() -> None:
    for raw in ['{"a":1}{"b":2}', '{"a": 1} x', "\t{}\n", '{"a": NaN, "b": -Infinity}', '{"a": "\\u00e9"}', "", "{"]:
        try:
            expected: object = json.loads(raw)
        except ValueError as exc:
            expected = f"are not valid JSON ({exc})"
        found = decoded(raw)
        assert repr(found) == repr(expected), raw
