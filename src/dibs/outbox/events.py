"""Outbox events: what is written (checked in full before anything is), and what is read back.

An event is checked before anything is written, so a bad one (a payload that is not JSON, an empty
aggregate id, headers that are not strings) raises :class:`~dibs.InvalidArgument` and nothing of the
call is stored. Events go in with one multi-row INSERT, on the caller's connection, in its transaction.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property, lru_cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row

from dibs._checks import checked_text
from dibs._errors import InvalidArgument
from dibs.dialects import Backend, backend_for
from dibs.schema import DEFAULT_TARGET, PENDING, aware, outbox
from dibs.tracing import active

#: PostgreSQL wakes idle relays on this channel when events are added (the payload names their targets).
CHANNEL = "dibs_outbox"
#: The longest of each of an event's names: their columns' sizes.
NAME_LIMITS = {"target": 100, "aggregate_type": 200, "aggregate_id": 200, "event_type": 200}
#: The most bytes an event's headers take as JSON: what MySQL's and MariaDB's TEXT column holds.
HEADERS_LIMIT = 65_535
#: The arguments an event is made of, as add() takes them and add_many() takes them in each mapping.
EVENT_FIELDS = ("aggregate_type", "aggregate_id", "event_type", "payload", "headers", "target")


@dataclass(frozen=True, kw_only=True)
class OutboxEvent:
    """One event as stored: what a publisher sends, and what inspection shows.

    ``payload_json`` is the payload as it was written (JSON text); :attr:`payload` decodes it.
    """

    id: int
    target: str
    aggregate_type: str
    aggregate_id: str
    event_type: str
    payload_json: str
    headers: dict[str, str]
    created_at: datetime
    status: str = PENDING
    retry_count: int = 0
    attempts: int = 0
    next_attempt_at: datetime | None = None
    last_error: str | None = None
    published_at: datetime | None = None

    @cached_property
    def payload(self) -> Any:
        """The payload, decoded from JSON."""
        return json.loads(self.payload_json)

    @classmethod
    def from_row(cls, row: Row[Any], *, status: str | None = None) -> OutboxEvent:
        """The event a row of the outbox table holds (all its columns, or those a claim returns)."""
        return cls.from_rows([row], status=status)[0]

    @classmethod
    def from_rows(cls, rows: Sequence[Row[Any]], *, status: str | None = None) -> list[OutboxEvent]:
        """The events rows of one query hold (rows of the same columns: where each field is, is worked out
        once, from the first)."""
        if not rows:
            return []
        required, optional_at, times_at = _layout(rows[0]._fields)
        events = []
        for row in rows:
            event_id, target, aggregate_type, aggregate_id, event_type, payload, headers, created_at = (
                row[position] for position in required
            )
            optional = {name: row[position] for name, position in optional_at if row[position] is not None}
            for name, position in times_at:
                optional[name] = aware(row[position])
            if status is not None:
                optional["status"] = status
            events.append(
                cls(
                    id=event_id,
                    target=target,
                    aggregate_type=aggregate_type,
                    aggregate_id=aggregate_id,
                    event_type=event_type,
                    payload_json=payload,
                    headers=json.loads(headers) if headers else {},
                    created_at=aware(created_at),
                    **optional,
                )
            )
        return events


_REQUIRED = ("id", "target", "aggregate_type", "aggregate_id", "event_type", "payload", "headers", "created_at")
_OPTIONAL = ("status", "retry_count", "attempts", "last_error")
_TIMES = ("next_attempt_at", "published_at")


@lru_cache(maxsize=64)
def _layout(
    fields: tuple[str, ...],
) -> tuple[tuple[int, ...], tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]:
    """Where a row with these columns holds each of an event's fields: the required ones' positions, and the
    optional ones and times it has, by name and position."""
    position = {name: at for at, name in enumerate(fields)}
    return (
        tuple(position[name] for name in _REQUIRED),
        tuple((name, position[name]) for name in _OPTIONAL if name in position),
        tuple((name, position[name]) for name in _TIMES if name in position),
    )


def new_event(
    *,
    aggregate_type: str,
    aggregate_id: str | int,
    event_type: str,
    payload: Any,
    headers: Mapping[str, str] | None = None,
    target: str | None = None,
    max_payload_bytes: int,
) -> dict[str, Any]:
    """The column values of one event; InvalidArgument saying what to change for the first bad argument."""
    if isinstance(aggregate_id, int) and not isinstance(aggregate_id, bool):
        aggregate_id = str(aggregate_id)
    names = {
        "target": DEFAULT_TARGET if target is None else target,
        "aggregate_type": aggregate_type,
        "aggregate_id": aggregate_id,
        "event_type": event_type,
    }
    for name, value in names.items():
        text = checked_text(value, name, NAME_LIMITS[name])
        if text != text.strip():
            raise InvalidArgument(f"{name} must not start or end with spaces, got {value!r}")
    try:
        encoded = json.dumps(payload, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(
            f"the payload of a {event_type!r} event is not JSON ({exc}); pass only str, int, float, bool, None, "
            "lists and dicts, and turn other values (dates, decimals, objects) into one of those first"
        ) from exc
    size = len(encoded.encode())
    if size > max_payload_bytes:
        raise InvalidArgument(
            f"the payload of a {event_type!r} event takes {size:,} bytes as JSON, over the limit of "
            f"{max_payload_bytes:,}; publish a reference to large data instead, or raise Outbox(max_payload_bytes=)"
        )
    traced = active()
    if traced is not None:
        headers = traced.with_context(headers)
    return {**names, "payload": encoded, "headers": None if headers is None else _encoded_headers(headers)}


def _encoded_headers(headers: object) -> str | None:
    """Headers as the JSON text stored, within HEADERS_LIMIT; None for none."""
    if not isinstance(headers, Mapping) or not all(
        isinstance(key, str) and key and isinstance(value, str) for key, value in headers.items()
    ):
        raise InvalidArgument(f"headers must be a dict of non-empty string names to string values, got {headers!r}")
    if not headers:
        return None
    # ASCII: one byte per character, however the column's character set counts them.
    encoded = json.dumps(dict(headers), separators=(",", ":"), ensure_ascii=True)
    if len(encoded) > HEADERS_LIMIT:
        raise InvalidArgument(
            f"headers take {len(encoded):,} bytes as JSON, over the limit of {HEADERS_LIMIT:,}; "
            "put large values in the payload instead"
        )
    for key, value in headers.items():
        checked_text(key, "a header's name", HEADERS_LIMIT)
        if value:
            checked_text(value, f"header {key!r}", HEADERS_LIMIT)
    return encoded


def event_from(fields: Mapping[str, Any], max_payload_bytes: int) -> dict[str, Any]:
    """new_event() from a mapping of add()'s argument names, as add_many() takes them."""
    if not isinstance(fields, Mapping):
        raise InvalidArgument(
            f"add_many takes a list of dicts with the keys {', '.join(EVENT_FIELDS)}; got a {type(fields).__name__}"
        )
    unknown = set(fields) - set(EVENT_FIELDS)
    missing = {"aggregate_type", "aggregate_id", "event_type", "payload"} - set(fields)
    if unknown or missing:
        problem = f"unknown keys {sorted(unknown)}" if unknown else f"missing keys {sorted(missing)}"
        raise InvalidArgument(f"an event has {problem}; an event's keys are {', '.join(EVENT_FIELDS)}")
    return new_event(**fields, max_payload_bytes=max_payload_bytes)


#: INSERT statements by (backend, returning ids): building one costs more than running it.
_statements: dict[tuple[str, bool], sa.Insert] = {}


def _statement(backend: Backend, returning: bool) -> sa.Insert:
    key = (backend.name, returning)
    statement = _statements.get(key)
    if statement is None:
        statement = sa.insert(outbox).values(
            {
                **{name: sa.bindparam(name, type_=outbox.c[name].type) for name in EVENT_FIELDS},
                "status": PENDING,
                "created_at": backend.now(),
            }
        )
        if returning:
            statement = statement.returning(outbox.c.id, sort_by_parameter_order=True)
        _statements[key] = statement
    return statement


def insert_events(conn: Connection, events: Sequence[dict[str, Any]], notify_channel: str | None) -> list[int]:
    """Insert checked events on ``conn`` (in its transaction); returns their ids, in order."""
    if not events:
        return []
    backend = backend_for(conn.dialect)
    inserted = backend.insert_rows(conn, lambda returning: _statement(backend, returning != "none"), events)
    ids = inserted.ids or [row[0] for row in inserted.rows]
    notify = backend.notify(notify_channel) if notify_channel else None
    if notify is not None:
        conn.execute(notify, {"dibs_payload": ",".join(sorted({event["target"] for event in events}))})
    return ids
