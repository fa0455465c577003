"""A job's arguments as the JSON text stored: what ``json.dumps(args, allow_nan=False, separators=(",", ":"))``
gives, byte for byte, whichever encoder makes it.

The standard library's C encoder is made once per thread (``json.dumps`` makes one per call, which costs
as much as encoding a job's few arguments). Where orjson is installed (the ``speedups`` extra), the
arguments most jobs have, a flat dict of text, integers, booleans and None, go through orjson, five times
faster; orjson writes those exactly as the standard encoder does, except for characters outside printable
ASCII, which it does not escape: an output holding any is made again by the standard encoder. Every other
value (floats, lists, nested dicts, subclasses, anything JSON has no words for) goes to the standard
encoder, so the text and the errors never depend on what is installed.
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
#: The types of the values orjson writes exactly as the standard encoder does (integers within 64 bits;
#: orjson refuses larger ones, which then go to the standard encoder).
_PLAIN = frozenset({str, int, bool, type(None)})
#: orjson, or None for the standard encoder alone.
FAST_DUMPS = _fast_dumps()


def _unencodable(value: Any) -> Any:
    raise TypeError(f"Object of type {value.__class__.__name__} is not JSON serializable")


#: Each thread's C encoder, with the table of what it is inside of (how it finds cycles): a shared table
#: would show a thread the arguments another thread is encoding, as a cycle.
_encoders = threading.local()


def encode(arguments: Mapping[str, Any]) -> str:
    """The JSON text of a job's arguments; TypeError or ValueError, as ``json.dumps`` raises them, for
    arguments JSON cannot hold."""
    if FAST_DUMPS is not None and type(arguments) is dict and _PLAIN.issuperset(map(type, arguments.values())):
        try:
            fast = FAST_DUMPS(arguments)
        except TypeError:  # a key that is not exactly a str, an integer beyond 64 bits
            pass
        else:
            # Printable ASCII only: the standard encoder would have escaped nothing orjson left as it was.
            if fast.isascii() and b"\x7f" not in fast:
                return fast.decode()
    return standard_encode(arguments)


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
