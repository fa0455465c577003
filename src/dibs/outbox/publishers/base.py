"""What every publisher is: one small interface a relay calls, whatever the broker.

A publisher gets a batch of events, at most one per aggregate (the claim sees to it), so it may send
them all at once. It answers per event: ``None`` once the broker has confirmed it, or the error that
kept it from being sent (the relay retries that event after a backoff). When the broker cannot be
reached at all it raises :class:`BrokerUnavailable` instead: the relay gives the whole batch back,
counting nothing against the events, and tries again later.

Every message carries the event's id (as a field, header or message id, as the broker allows) so
that consumers can drop the duplicates at-least-once delivery brings.
"""

from __future__ import annotations

import abc
import contextlib
import json
import re
import string
from collections.abc import Mapping, Sequence
from functools import lru_cache
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from dibs._errors import BrokerUnavailable, InvalidArgument
from dibs.engine import query_secrets_hidden
from dibs.outbox.events import OutboxEvent

__all__ = [
    "BrokerUnavailable",
    "Publisher",
    "Template",
    "envelope",
    "redacted",
    "seconds_option",
    "split_options",
    "token",
    "whole_option",
]

#: What a topic, subject, stream or routing key template may name.
TEMPLATE_FIELDS = ("target", "aggregate_type", "event_type")


class Publisher(abc.ABC):
    """Sends outbox events to one broker. Subclasses implement :meth:`publish`, and :meth:`connect` and
    :meth:`close` where the broker keeps a connection."""

    #: What the URL names, for messages and logs (with no password).
    description: str = ""

    async def connect(self) -> None:  # noqa: B027 - a publisher without a connection needs none
        """Open the connection; raise BrokerUnavailable, saying what was tried, if the broker cannot be reached."""

    @abc.abstractmethod
    async def publish(self, events: Sequence[OutboxEvent]) -> list[BaseException | None]:
        """Send the events; per event, None when the broker confirmed it, else the error."""

    async def close(self) -> None:  # noqa: B027 - a publisher without a connection needs none
        """Close the connection, if any."""

    async def __aenter__(self) -> Publisher:
        await self.connect()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.close()


def envelope(event: OutboxEvent) -> str:
    """The event as one JSON object: id, target, aggregate_type, aggregate_id, event_type, payload (as it was
    written, not re-encoded), headers and created_at (ISO 8601)."""
    return (
        f'{{"id":{event.id},"target":{json.dumps(event.target)},"aggregate_type":{json.dumps(event.aggregate_type)},'
        f'"aggregate_id":{json.dumps(event.aggregate_id)},"event_type":{json.dumps(event.event_type)},'
        f'"payload":{event.payload_json},"headers":{json.dumps(event.headers)},'
        f'"created_at":"{event.created_at.isoformat()}"}}'
    )


#: The characters a field's value keeps in a name; every other one is escaped.
_TOKEN_SAFE = re.compile(r"[A-Za-z0-9_-]*")


@lru_cache(maxsize=4096)
def token(value: str) -> str:
    """A field's value as one token of a name: letters, digits, ``_`` and ``-`` as they are, every other
    character as ``%XX`` per byte of its UTF-8 form (``order line.*`` is ``order%20line%2E%2A``).

    So a value never adds a level (``.``), a wildcard (``*``, ``>``, ``#``) or a space to a subject or routing
    key, and two different values always make two different names (``%`` itself is escaped).
    """
    if _TOKEN_SAFE.fullmatch(value):
        return value
    return "".join(
        char if char.isascii() and _TOKEN_SAFE.fullmatch(char) else "".join(f"%{byte:02X}" for byte in char.encode())
        for char in value
    )


class Template:
    """A name made from an event's fields, such as ``orders.{event_type}``; checked when it is made.

    Each field's value goes in as one :func:`token`, escaped: the template's own text is the name's only
    structure.
    """

    def __init__(self, text: str, what: str) -> None:
        try:
            fields = [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]
        except ValueError as error:  # an unclosed or stray brace
            raise InvalidArgument(
                f"the {what} {text!r} is not a template ({error}); write a field as {{event_type}}, and a brace "
                "itself as {{ or }}"
            ) from error
        unknown = [name for name in fields if name not in TEMPLATE_FIELDS]
        if not text or unknown:
            raise InvalidArgument(
                f"the {what} {text!r} may use only {', '.join('{' + name + '}' for name in TEMPLATE_FIELDS)}"
                + (f", not {', '.join('{' + name + '}' for name in unknown)}" if unknown else "")
            )
        self.text = text
        self.fixed = not fields

    def __call__(self, event: OutboxEvent) -> str:
        if self.fixed:
            return self.text
        return self.text.format(
            target=token(event.target), aggregate_type=token(event.aggregate_type), event_type=token(event.event_type)
        )


def split_options(url: str, ours: Mapping[str, str | None]) -> tuple[str, dict[str, str]]:
    """The URL without the query options dibs reads (``ours``: name to default), and those options' values.

    Other query options stay in the URL for the broker's client; an option named twice is an error.
    """
    parts = urlsplit(url)
    kept: list[tuple[str, str]] = []
    found: dict[str, str] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in ours:
            if name in found:
                raise InvalidArgument(f"the publisher URL names {name}= twice: {redacted(url)}")
            found[name] = value
        else:
            kept.append((name, value))
    query = urlencode(kept)
    options = {name: found.get(name, default) for name, default in ours.items() if name in found or default is not None}
    return urlunsplit(parts._replace(query=query)), options  # type: ignore[return-value]


def redacted(url: str) -> str:
    """The URL with its password hidden, or its user when there is no password (NATS puts tokens there), and
    the values of query options that name a secret (``?password=``)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return query_secrets_hidden(url)
    host = parts.hostname or ""
    with contextlib.suppress(ValueError):
        if parts.port is not None:
            host = f"{host}:{parts.port}"
    user = f"{parts.username}:***@" if parts.password is not None else "***@"
    return query_secrets_hidden(urlunsplit(parts._replace(netloc=user + host)))


def whole_option(options: Mapping[str, Any], name: str, url: str) -> int | None:
    """An option that must be a positive whole number, or None when not given."""
    value = options.get(name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise InvalidArgument(f"{name}= must be a positive whole number, got {value!r} in {redacted(url)}")
    return number


def seconds_option(options: Mapping[str, Any], name: str, url: str) -> float | None:
    """An option that must be a positive number of seconds, or None when not given."""
    value = options.get(name)
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise InvalidArgument(f"{name}= must be a positive number of seconds, got {value!r} in {redacted(url)}")
    return seconds
