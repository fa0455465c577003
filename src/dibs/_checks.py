"""Every argument check dibs makes on names, keys, durations, times and counts, once, with the limits the
README documents.

Each check runs before anything is written, so that a value no backend can store, or one that some
backend would store differently (cut short, refused mid-transaction), raises :class:`~dibs.InvalidArgument`
saying what to change, and a caller's transaction stays usable.
"""

from __future__ import annotations

import operator
import os
import re
import socket
import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from dibs._errors import InvalidArgument

#: Names of tasks, queues, tags and schedules: letters, digits and ``_ . : -``, so that they read well in
#: logs, URLs and shells and can never be mistaken for SQL.
_NAME = re.compile(r"[A-Za-z0-9_.:\-]+")

#: The longest duration dibs takes (a delay, a lease, a retry's backoff, a schedule's interval, an age):
#: far beyond any real schedule, and a date every backend can still add to the current time.
LONGEST = timedelta(days=36_500)
_LONGEST_SECONDS = LONGEST.total_seconds()
#: The times dibs takes (``run_at``) lie in [EARLIEST, LATEST): every backend stores them, and a driver
#: reads them back in any session time zone without leaving the years 1 to 9999 that Python holds.
EARLIEST = datetime(1970, 1, 1, tzinfo=timezone.utc)
LATEST = datetime(9999, 1, 1, tzinfo=timezone.utc)
#: The most rows one call claims, lists or handles at once: what a 32-bit LIMIT parameter holds.
MOST_ROWS = 2**31 - 1
#: The longest lease owner (a worker's, relay's or runner's name): the size of the owner column.
OWNER_LIMIT = 200
#: The most characters of an error kept on a row (a job's or an event's last error): MySQL's TEXT holds 64 KiB.
ERROR_LIMIT = 60_000


def default_owner() -> str:
    """A lease owner name unique to this process and call: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def checked_owner(value: object, what: str = "owner (the name of the worker)") -> str:
    """``value`` if it is a lease owner's name of 1 to :data:`OWNER_LIMIT` characters; InvalidArgument otherwise."""
    return checked_text(value, what, OWNER_LIMIT)


def checked_integer(value: object, what: str, low: int, high: int | None = None) -> int:
    """``value`` if it is an int (not a bool) from ``low`` to ``high`` (None: no upper bound); InvalidArgument
    otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        wanted = f"from {low:,} to {high:,}" if high is not None else f">= {low:,}"
        raise InvalidArgument(f"{what} must be a whole number {wanted}, got {value!r}")
    return value


#: The largest id a row of a dibs table can have (a signed 64-bit integer).
LARGEST_ID = 2**63 - 1


def checked_id(value: object, what: str) -> int:
    """A row id (a job's, an event's): a whole number from 1 to :data:`LARGEST_ID`; InvalidArgument
    otherwise, before any database sees it (each would answer a wrong type differently)."""
    return checked_integer(value, what, 1, LARGEST_ID)


def checked_number(value: object, what: str, low: float, high: float, *, high_included: bool = True) -> float:
    """``value`` if it is an int or float (not a bool, not NaN) from ``low`` to ``high``; InvalidArgument
    otherwise."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value
    if not ok or not (value <= high if high_included else value < high):  # type: ignore[operator]
        upper = "at most" if high_included else "below"
        raise InvalidArgument(f"{what} must be a number from {low} to {upper} {high}, got {value!r}")
    return float(value)  # type: ignore[arg-type]


def checked_name(value: object, what: str, limit: int = 100) -> str:
    """``value`` if it is a name of 1 to ``limit`` letters, digits or ``_ . : -``; InvalidArgument otherwise."""
    if not isinstance(value, str) or not 0 < len(value) <= limit or not _NAME.fullmatch(value):
        raise InvalidArgument(f"{what} must be 1 to {limit} letters, digits or _ . : - characters, got {value!r}")
    return value


def checked_text(value: object, what: str, limit: int) -> str:
    """``value`` if it is text of 1 to ``limit`` characters that every backend stores as given: no NUL
    character (PostgreSQL refuses it) and no lone surrogate (no driver can encode it); InvalidArgument
    otherwise."""
    if not isinstance(value, str) or not 0 < len(value) <= limit:
        raise InvalidArgument(f"{what} must be a string of 1 to {limit} characters, got {_shown(value)}")
    if "\x00" in value:
        raise InvalidArgument(f"{what} must not contain NUL characters (\\x00), got {_shown(value)}")
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError as exc:
            raise InvalidArgument(f"{what} must be valid Unicode text ({exc.reason}), got {_shown(value)}") from exc
    return value


def checked_seconds(value: object, what: str, *, zero: bool = False) -> float:
    """A duration (a timedelta or a number of seconds) as seconds: more than 0 (or 0 itself, with ``zero``)
    and at most :data:`LONGEST`; InvalidArgument otherwise."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    # NaN is the one number not equal to itself (math.isnan would overflow on a huge int).
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds != seconds:
        raise InvalidArgument(f"{what} must be a number of seconds or a timedelta, got {value!r}")
    if seconds < 0 or (seconds == 0 and not zero):
        wanted = "must not be negative" if zero else "must be a positive number of seconds or timedelta"
        raise InvalidArgument(f"{what} {wanted}, got {value!r}")
    if seconds > _LONGEST_SECONDS:
        raise InvalidArgument(f"{what} must be at most {LONGEST.days:,} days (100 years), got {_shown(value)}")
    return float(seconds)


def checked_moment(value: object, what: str) -> datetime:
    """An aware datetime from :data:`EARLIEST` (included) to :data:`LATEST` (excluded), in UTC;
    InvalidArgument otherwise."""
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise InvalidArgument(
            f"{what} must be a timezone-aware datetime, such as datetime.now(timezone.utc) + timedelta(minutes=5), "
            f"got {value!r}"
        )
    # Compared before converting: an aware datetime.min or datetime.max overflows on the way to UTC.
    if not EARLIEST <= value < LATEST:
        raise InvalidArgument(
            f"{what} must lie from {EARLIEST:%Y-%m-%d} to before {LATEST:%Y-%m-%d} (UTC), got {value.isoformat()}"
        )
    return value.astimezone(timezone.utc)


def checked_count(value: object, what: str, minimum: int | None = 1) -> int:
    """A whole number from ``minimum`` (None: any) to :data:`MOST_ROWS`; InvalidArgument otherwise."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        wanted = "a whole number" if minimum is None else f"a whole number >= {minimum}"
        raise InvalidArgument(f"{what} must be {wanted}, got {value!r}")
    number = operator.index(value)
    if number > MOST_ROWS:
        raise InvalidArgument(f"{what} must be at most {MOST_ROWS:,} (a 32-bit integer), got {number:,}")
    if minimum is not None and number < minimum:
        raise InvalidArgument(f"{what} must be a whole number >= {minimum}, got {number!r}")
    return number


def checked_attempts(value: object, what: str = "max_attempts") -> int:
    """A number of attempts: a whole number from 1 to :data:`MOST_ROWS`; InvalidArgument otherwise."""
    if not isinstance(value, int):
        raise InvalidArgument(f"{what} must be a whole number >= 1, got {value!r}")
    return checked_count(value, what)


def checked_priority(value: object) -> int:
    """A job's priority: a whole number from -1,000,000 to 1,000,000; InvalidArgument otherwise."""
    return checked_integer(value, "priority", -1_000_000, 1_000_000)


def checked_options(value: object, what: str) -> dict[str, Any]:
    """``value`` (None for none) as a dict of keyword options; InvalidArgument unless it maps names to values."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(key, str) and key.isidentifier() for key in value):
        raise InvalidArgument(f"{what} must be a dict of options by name, like {{'echo': True}}; got {_shown(value)}")
    return dict(value)


def _shown(value: object) -> str:
    """A value as an error message shows it: its repr, cut short if long."""
    shown = repr(value)
    return shown if len(shown) <= 80 else f"{shown[:60]}... ({len(value) if isinstance(value, str) else '?'} chars)"
