"""A job's arguments are stored as the JSON ``json.dumps`` gives, compact, byte for byte, and what it refuses
(NaN, infinities, values JSON has no words for) is refused with the same advice: with orjson (the speedups
extra, installed with dev) and without it."""

from __future__ import annotations

import enum
import json
import math
import random
import threading
from datetime import date
from decimal import Decimal
from typing import Any

import pytest

import dibs
from dibs.dialects.batch import chunks
from dibs.queue import arguments_json
from dibs.queue.enqueue import encoded_args

TRICKY: list[dict[str, Any]] = [
    {},
    {"name": "Zoë ✓ 東京 \U0001f600", "ключ": "значение", "ünïcode-kéy": ["ä", {"ß": None}]},
    {"floats": [0.1, 1e16, 1e-7, -0.0, 1.5e300, 2.0**-1074, 123456789.123456789, 1 / 3]},
    {"ints": [0, -1, 2**63, -(2**64), 10**30], "bools": [True, False], "none": None},
    {"nested": {"a": [{"b": [[], {}, [1, [2, [3]]]]}]}, "quote": 'he said "hi"\\', "ctl": "\t\n\x00\x1f"},
    {"tuple": (1, 2), "surrogate": "\ud800"},
    # Flat: what orjson may write, and the edges where it would not write what json.dumps does.
    {"id": 7, "sku": "SKU-00042", "ok": True, "no": False, "none": None, "empty": ""},
    {"ctl": "\x00\x01\x08\t\n\x0b\x0c\r\x1f", "quote": '"\\/', "del": "a\x7fb"},
    {"accent": "café", "emoji": "\U0001f600", "ascii": "plain"},
    {"edges": 2**63 - 1, "low": -(2**63), "u64": 2**64 - 1, "past": 2**64, "below": -(2**63) - 1},
    {"kéy": 1},
    {"float": 1e16},
]


class Color(enum.IntEnum):
    RED = 1


class Text(str):
    pass


#: Flat arguments whose values or keys are subclasses: json.dumps writes them by their base type.
SUBCLASSED: list[dict[str, Any]] = [{"color": Color.RED}, {"text": Text("x")}, {Text("key"): 1}]


@pytest.fixture(params=["orjson", "standard"])
def encoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test runs with orjson where it is installed (dev installs it) and with the standard encoder alone."""
    if request.param == "orjson" and arguments_json.FAST_DUMPS is None:
        pytest.fail("orjson is not installed: the dev extra installs it (pip install -e '.[dev]')")
    if request.param == "standard":
        monkeypatch.setattr(arguments_json, "FAST_DUMPS", None)
    return str(request.param)


def _text(args: Any) -> str:
    return encoded_args(_task(), args, 10**6)[0]


def _task() -> dibs.Task:
    # encoded_args reads only the task's name: no app or database is needed.
    return dibs.Task(app=None, function=lambda **_: None, name="t")  # type: ignore[arg-type]


@pytest.mark.parametrize("args", TRICKY + SUBCLASSED, ids=range(len(TRICKY) + len(SUBCLASSED)))
def test_arguments_are_stored_as_json_dumps_writes_them(args: dict[str, Any], encoder: str) -> None:
    expected = json.dumps(args, allow_nan=False, separators=(",", ":"))
    assert _text(args) == expected


def test_flat_arguments_of_any_characters_and_integers_are_stored_as_json_dumps_writes_them(encoder: str) -> None:
    draw = random.Random(20261128)
    # Every code point class at once: control characters, printable ASCII, DEL, Latin, CJK, astral.
    points = [*range(0x80), 0xE9, 0x7FF, 0x800, 0x6771, 0xFFFF, 0x10000, 0x1F600, 0x10FFFF]
    for _ in range(3000):
        args: dict[str, Any] = {}
        for _ in range(draw.randint(0, 6)):
            name = "".join(chr(draw.choice(points[0x20:0x7F])) for _letter in range(draw.randint(1, 8)))
            kind = draw.randrange(4)
            if kind == 0:
                args[name] = "".join(chr(draw.choice(points)) for _letter in range(draw.randint(0, 12)))
            elif kind == 1:
                args[name] = draw.choice(
                    [0, 1, -1, 2**63 - 1, -(2**63), 2**64 - 1, 2**64, 10**30, draw.randint(-(10**12), 10**12)]
                )
            else:
                args[name] = draw.choice([True, False, None])
        text, decoded = encoded_args(_task(), args, 10**6)
        assert text == json.dumps(args, allow_nan=False, separators=(",", ":"))
        assert decoded == json.loads(text)


@pytest.mark.parametrize("args", TRICKY + SUBCLASSED, ids=range(len(TRICKY) + len(SUBCLASSED)))
def test_arguments_come_with_what_their_json_decodes_to_where_a_copy_of_them_is_that(args: dict[str, Any]) -> None:
    # The jobs an enqueue returns hold a copy of flat arguments of plain values instead of their JSON
    # decoded: only where the two are equal, of the same types, and the copy is not the caller's dict.
    text, decoded = encoded_args(_task(), args, 10**6)
    flat = all(type(name) is str for name in args) and all(
        type(value) in (str, int, bool, type(None)) for value in args.values()
    )
    if not flat:
        assert decoded is None
        return
    assert decoded is not None
    assert decoded is not args
    assert decoded == json.loads(text)
    assert [(type(name), type(value)) for name, value in decoded.items()] == [
        (type(name), type(value)) for name, value in json.loads(text).items()
    ]


def test_flat_arguments_of_text_and_integers_are_written_by_orjson_where_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fast = arguments_json.FAST_DUMPS
    if fast is None:
        pytest.fail("orjson is not installed: the dev extra installs it (pip install -e '.[dev]')")
    seen: list[dict[str, Any]] = []

    def watched(value: Any) -> bytes:
        seen.append(value)
        return fast(value)

    monkeypatch.setattr(arguments_json, "FAST_DUMPS", watched)
    flat = {"order": 1, "sku": "SKU-1", "gift": False, "note": None}
    assert _text(flat) == '{"order":1,"sku":"SKU-1","gift":false,"note":null}'
    assert seen == [flat]
    for other in ({"price": 9.5}, {"ids": [1, 2]}, {"color": Color.RED}):
        encoded_args(_task(), other, 10**6)
    assert seen == [flat]  # floats, lists and subclasses never reach orjson


@pytest.mark.parametrize(
    "args",
    [
        {"x": math.nan},
        {"x": [math.inf]},
        {"when": date(2030, 1, 1)},
        {"n": Decimal(1)},
        {"s": {1, 2}},
        {"c": enum.Enum},
    ],
)
def test_values_json_has_no_words_for_are_refused_as_json_dumps_refuses_them(
    args: dict[str, Any], encoder: str
) -> None:
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
    assert _text(unencodable) == '{"a":{"n":1},"b":[{"n":1}]}'


def test_threads_encoding_the_same_arguments_at_once_all_get_their_json() -> None:
    shared = {"ids": list(range(2000)), "nested": [{"k": "v" * 50}] * 200}
    expected = json.dumps(shared, separators=(",", ":"))
    start = threading.Barrier(8)
    results: list[str] = []

    def encode() -> None:
        start.wait()
        results.extend(_text(shared) for _ in range(50))

    threads = [threading.Thread(target=encode) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [expected] * 400


def test_the_size_limit_counts_bytes_of_the_json(encoder: str) -> None:
    text = {"s": "é" * 10}  # escaped: 6 bytes each
    assert len(encoded_args(_task(), text, 68)[0]) == 68
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
