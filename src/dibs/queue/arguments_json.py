"""A job's arguments as the JSON text stored: what ``json.dumps(args, allow_nan=False, separators=(",", ":"))``
gives, byte for byte, whichever encoder makes it; and the same arguments as that text decodes to.

Most jobs' arguments are a flat dict of plain values: names and values of exactly str, int, bool or None.
Such arguments come back from their JSON as an equal dict of the same types, so a copy of them stands for
the text decoded, for the jobs an enqueue returns, at a tenth of the decoding's cost. Where orjson is
installed (the ``speedups`` extra) their text is written by orjson, five times faster than the standard
encoder; orjson writes those values exactly as the standard encoder does, except for non-ASCII characters
and DEL, which it leaves unescaped: an output holding any is made again by the standard encoder.
Every other value (floats, lists, nested dicts, subclasses, anything JSON has no words for) goes to the
standard library's C encoder, made once per thread (``json.dumps`` makes one per call, which costs as much
as encoding a job's few arguments), so the text and the errors never depend on what is installed.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any


def _fast_dumps() -> Callable[[Any], bytes] | None:
    """orjson's encoder, or None when the speedups extra is not installed."""
    try:
        from orjson import dumps
    except ImportError:
        return None
    return dumps


#: The JSON of job arguments: compact, ASCII only, and refusing NaN and infinities, which JSON has no words for.
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"))
#: The types of plain values: their JSON decodes to an equal value of the same type, and orjson writes them
#: exactly as the standard encoder does (integers within 64 bits; orjson refuses larger ones, which then go
#: to the standard encoder).
_PLAIN = frozenset({str, int, bool, type(None)})
#: The type of argument names their JSON keeps as they are.
NAMES = frozenset({str})
#: orjson, or None for the standard encoder alone.
FAST_DUMPS = _fast_dumps()
#: The standard decoder's scanner, in C: one call reads a JSON value that starts at an index (stored arguments,
#: or a batch's joined into one array), where ``json.loads`` adds three Python calls around it that cost twice
#: the reading of a job's few arguments. It leaves whitespace around the value, and any text after it, unread.
SCAN_JSON: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _unencodable(value: Any) -> Any:
    raise TypeError(f"Object of type {value.__class__.__name__} is not JSON serializable")


#: Each thread's C encoder, with the table of what it is inside of (how it finds cycles): a shared table
#: would show a thread the arguments another thread is encoding, as a cycle.
_encoders = threading.local()


def encoded(arguments: Mapping[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """The JSON text of a job's arguments and, for a flat dict of plain values, a copy of them (what the
    text decodes to; None for other arguments); TypeError or ValueError, as ``json.dumps`` raises them,
    for arguments JSON cannot hold."""
    if type(arguments) is not dict or not _PLAIN.issuperset(map(type, arguments.values())):
        return standard_encode(arguments), None
    fast = _orjson_text(arguments)
    if fast is not None:  # orjson takes names of exactly str only
        return fast, dict(arguments)
    plain = NAMES.issuperset(map(type, arguments))
    return standard_encode(arguments), dict(arguments) if plain else None


def _orjson_text(arguments: dict[str, Any]) -> str | None:
    """orjson's JSON of flat plain arguments, where it is what the standard encoder would write."""
    if FAST_DUMPS is None:
        return None
    try:
        fast = FAST_DUMPS(arguments)
    except TypeError:  # a name that is not exactly a str, an integer beyond 64 bits
        return None
    # Printable ASCII only: the standard encoder would have escaped nothing orjson left as it was.
    return fast.decode() if fast.isascii() and b"\x7f" not in fast else None


def standard_encode(arguments: Mapping[str, Any]) -> str:
    """The JSON text of a job's arguments by the standard library's encoder alone."""
    if c_make_encoder is None:  # an interpreter without the C accelerator
        return _ENCODER.encode(arguments)
    made = getattr(_encoders, "made", None)
    if made is None:
        inside: dict[int, Any] = {}
        encode = c_make_encoder(inside, _unencodable, encode_basestring_ascii, None, ":", ",", False, False, False)
        made = _encoders.made = (inside, encode)
    inside, encoder = made
    try:
        return "".join(encoder(arguments, 0))
    except BaseException:
        inside.clear()  # the encoder leaves in it what it was inside of when it failed
        raise
