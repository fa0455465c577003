"""A job's arguments are stored as the JSON ``json.dumps`` gives, compact, byte for byte, and what it refuses
(NaN, infinities, values JSON has no words for) is refused with the same advice."""

from __future__ import annotations

import json
import math
import threading
from datetime import date
from decimal import Decimal
from typing import Any

import pytest

import dibs
from dibs.dialects.batch import chunks
from dibs.queue.enqueue import encoded_args

TRICKY: list[dict[str, Any]] = [
    {},
    {"name": "Zoë ✓ 東京 \U0001f600", "ключ": "значение", "ünïcode-kéy": ["ä", {"ß": None}]},
    {"floats": [0.1, 1e16, 1e-7, -0.0, 1.5e300, 2.0**-1074, 123456789.123456789, 1 / 3]},
    {"ints": [0, -1, 2**63, -(2**64), 10**30], "bools": [True, False], "none": None},
    {"nested": {"a": [{"b": [[], {}, [1, [2, [3]]]]}]}, "quote": 'he said "hi"\\', "ctl": "\t\n\x00\x1f"},
    {"tuple": (1, 2), "surrogate": "\ud800"},
]


def _task() -> dibs.Task:
    # encoded_args reads only the task's name: no app or database is needed.
    return dibs.Task(app=None, function=lambda **_: None, name="t")  # type: ignore[arg-type]


@pytest.mark.parametrize("args", TRICKY, ids=range(len(TRICKY)))
def test_arguments_are_stored_as_json_dumps_writes_them(args: dict[str, Any]) -> None:
    expected = json.dumps(args, allow_nan=False, separators=(",", ":"))
    assert encoded_args(_task(), args, 10**6) == expected


@pytest.mark.parametrize(
    "args", [{"x": math.nan}, {"x": [math.inf]}, {"when": date(2030, 1, 1)}, {"n": Decimal(1)}, {"s": {1, 2}}]
)
def test_values_json_has_no_words_for_are_refused_as_json_dumps_refuses_them(args: dict[str, Any]) -> None:
    with pytest.raises((TypeError, ValueError)) as plain:
        json.dumps(args, allow_nan=False, separators=(",", ":"))
    with pytest.raises(dibs.InvalidArgument, match=r"are not JSON .*turn other values") as refused:
        encoded_args(_task(), args, 10**6)
    assert str(plain.value) in str(refused.value)


def test_arguments_that_contain_themselves_are_refused_at_once() -> None:
    # Found as a cycle when it is first met: followed to the recursion limit, a large value beside it would
    # be encoded a thousand times over before the size limit is checked.
    looped: dict[str, Any] = {"blob": "x" * 100_000}
    looped["self"] = looped
    listed: list[Any] = [1]
    listed.append(listed)
    for args in (looped, {"items": listed}):
        with pytest.raises(dibs.InvalidArgument, match=r"are not JSON \(Circular reference detected\)"):
            encoded_args(_task(), args, 10**6)
    # A failure leaves nothing behind that would make the next arguments look like a cycle.
    shared = {"n": 1}
    unencodable: dict[str, Any] = {"a": shared, "b": [shared, {1, 2}]}
    with pytest.raises(dibs.InvalidArgument, match="not JSON serializable"):
        encoded_args(_task(), unencodable, 10**6)
    unencodable["b"].pop()
    assert encoded_args(_task(), unencodable, 10**6) == '{"a":{"n":1},"b":[{"n":1}]}'


def test_threads_encoding_the_same_arguments_at_once_all_get_their_json() -> None:
    shared = {"ids": list(range(2000)), "nested": [{"k": "v" * 50}] * 200}
    expected = json.dumps(shared, separators=(",", ":"))
    start = threading.Barrier(8)
    results: list[str] = []

    def encode() -> None:
        start.wait()
        results.extend(encoded_args(_task(), shared, 10**6) for _ in range(50))

    threads = [threading.Thread(target=encode) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [expected] * 400


def test_the_size_limit_counts_bytes_of_the_json() -> None:
    text = {"s": "é" * 10}  # escaped: 6 bytes each
    assert len(encoded_args(_task(), text, 68)) == 68
    with pytest.raises(dibs.InvalidArgument, match="take 68 bytes as JSON, over the limit of 67"):
        encoded_args(_task(), text, 67)


def test_a_batch_splits_into_statements_of_a_few_sizes_within_the_bytes() -> None:
    rows = {"args": ["x" * 10] * 1300, "key": [None] * 1300}
    assert chunks(rows, 512) == [(0, 512), (512, 1024), (1024, 1280), (1280, 1296), (1296, 1300)]
    assert chunks(rows, 512, powers=False) == [(0, 512), (512, 1024), (1024, 1300)]
    assert chunks(rows, 512, size_bytes=1000) == [(start, start + 64) for start in range(0, 1280, 64)] + [
        (1280, 1296),
        (1296, 1300),
    ]
    assert chunks({"args": ["x" * 5000] * 3}, 512, size_bytes=1000) == [(0, 1), (1, 2), (2, 3)]
