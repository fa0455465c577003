"""NATS JetStream: each event is one JetStream publish, a batch sent at once, each waiting for its ack.

``nats://host:4222?subject=dibs.{aggregate_type}&stream=DIBS&timeout=10`` (``tls://`` for TLS): the
subject may use the event's target, aggregate_type and event_type (default ``dibs.{aggregate_type}``),
each escaped into one token (:func:`~dibs.outbox.publishers.base.token`): aggregate type ``a.*`` is
published on ``dibs.a%2E%2A``, never on a wildcard, another level or an invalid subject.
With ``stream``, connecting creates that stream if it does not exist, over the subject's wildcard form
(``dibs.>`` for the default; the subject itself when it has no fields); a stream that exists is left as
it is. ``timeout`` is how long to wait for each ack, in seconds (default 10).

The body is the envelope (JSON). Headers: ``Nats-Msg-Id`` (the event id, so JetStream drops a repeat
within the stream's duplicate window), ``dibs-event-id``, ``dibs-aggregate-type``,
``dibs-aggregate-id``, ``dibs-event-type``, after the event's own headers. A subject that no stream
takes is an error for that event (it is retried), not a loss.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from dibs._errors import InvalidArgument
from dibs.outbox.events import OutboxEvent
from dibs.outbox.publishers.base import (
    BrokerUnavailable,
    Publisher,
    Template,
    envelope,
    redacted,
    seconds_option,
    split_options,
)

log = logging.getLogger("dibs.outbox")

#: Characters a JetStream stream name may not hold.
_NOT_IN_STREAM_NAMES = frozenset(">*. /\\\t\r\n")
#: How long one attempt to connect may take, how many more attempts, and the pause between them.
CONNECT_TIMEOUT = 2
RECONNECT_ATTEMPTS = 2
RECONNECT_WAIT = 0.5
#: The JetStream API's error code for "stream name already in use".
_STREAM_EXISTS = 10058


def stream_subject(template: Template) -> str:
    """The subject a stream needs to take every subject the template makes: up to the first field, then ``>``."""
    if template.fixed:
        return template.text
    tokens: list[str] = []
    for token in template.text.split("."):
        if "{" in token:
            break
        tokens.append(token)
    return ".".join([*tokens, ">"])


@dataclass
class _Link:
    """One connection: the client, its JetStream context, and an event set when it drops."""

    client: Any = None
    js: Any = None
    lost: asyncio.Event = field(default_factory=asyncio.Event)  # a new one each time the client reconnects


class NoStream(Exception):
    """No JetStream stream takes the event's subject: nothing stored it."""


class NatsJetStream(Publisher):
    def __init__(self, url: str) -> None:
        try:
            import nats
            import nats.errors
            import nats.js.errors
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise InvalidArgument("publishing to NATS needs nats-py: pip install 'dibs-sql[nats]'") from exc
        self._nats = nats
        server, options = split_options(url, {"subject": "dibs.{aggregate_type}", "stream": None, "timeout": "10"})
        parts = urlsplit(server)
        self.description = redacted(urlunsplit(parts._replace(query="")))
        if parts.query:
            unknown = sorted({item.split("=", 1)[0] for item in parts.query.split("&")})
            raise InvalidArgument(
                f"unknown option {', '.join(name + '=' for name in unknown)} in {self.description}; "
                "a NATS URL takes subject=, stream= and timeout="
            )
        try:
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number
        except ValueError as exc:
            raise InvalidArgument(f"{self.description} is not a NATS URL ({exc}); write nats://host:4222") from exc
        if parts.scheme.lower() not in ("nats", "tls") or not parts.hostname:
            raise InvalidArgument(f"a NATS URL is nats://host:4222 or tls://host:4222, got {self.description}")
        self._server = urlunsplit(parts._replace(query="", fragment=""))
        self.subject = Template(options["subject"], "subject")
        self.timeout = seconds_option(options, "timeout", url) or 10.0
        self.stream: str | None = options.get("stream")
        self.stream_subject: str | None = None
        if self.stream is not None:
            if not self.stream or _NOT_IN_STREAM_NAMES.intersection(self.stream):
                raise InvalidArgument(
                    f"stream= must be a name without spaces, dots, '*', '>' or slashes, got {self.stream!r}"
                )
            self.stream_subject = stream_subject(self.subject)
            if self.stream_subject == ">":
                raise InvalidArgument(
                    f"with stream=, the subject must begin with a fixed token, such as dibs.{{aggregate_type}}; "
                    f"got {self.subject.text!r}"
                )
        self._link: _Link | None = None
        self._linking = asyncio.Lock()  # lanes that find no connection make one between them
        self._connecting = False
        self._last_error: Exception | None = None

    async def _on_error(self, error: Exception) -> None:
        # nats-py reports each failed attempt here; connect() raises for those, so they are only debug.
        self._last_error = error
        log.log(logging.DEBUG if self._connecting else logging.WARNING, "NATS at %s: %r", self.description, error)

    async def connect(self) -> None:
        if self._link is not None and not self._link.client.is_closed:
            return
        async with self._linking:
            if self._link is not None and not self._link.client.is_closed:
                return
            self._link = None
            self._link = await self._connect()

    async def _connect(self) -> _Link:
        nats = self._nats
        link = _Link()

        async def on_lost() -> None:
            link.lost.set()

        async def on_back() -> None:
            link.lost = asyncio.Event()

        self._connecting = True
        self._last_error = None
        try:
            client = await nats.connect(
                self._server,
                name="dibs outbox",
                connect_timeout=CONNECT_TIMEOUT,
                allow_reconnect=True,
                max_reconnect_attempts=RECONNECT_ATTEMPTS,
                reconnect_time_wait=RECONNECT_WAIT,
                error_cb=self._on_error,
                disconnected_cb=on_lost,
                closed_cb=on_lost,
                reconnected_cb=on_back,
            )
        except (nats.errors.Error, OSError, asyncio.TimeoutError) as exc:
            cause = self._last_error or exc
            raise BrokerUnavailable(f"cannot reach NATS at {self.description}: {cause!r}") from exc
        finally:
            self._connecting = False
        link.client, link.js = client, client.jetstream(timeout=self.timeout)
        try:
            await self._ensure_stream(link.js)
        except BaseException:
            await client.close()
            raise
        return link

    async def _ensure_stream(self, js: Any) -> None:
        if self.stream is None:
            return
        errors = self._nats.js.errors
        try:
            try:
                await js.stream_info(self.stream)
            except errors.NotFoundError:
                try:
                    await js.add_stream(name=self.stream, subjects=[self.stream_subject])
                except errors.BadRequestError as exc:
                    if exc.err_code != _STREAM_EXISTS:  # made meanwhile by another relay: use it as it is
                        raise InvalidArgument(
                            f"NATS at {self.description} refused to make stream {self.stream!r} over "
                            f"{self.stream_subject!r}: {exc.description}"
                        ) from exc
        except (self._nats.errors.NoRespondersError, errors.ServiceUnavailableError) as exc:
            raise BrokerUnavailable(
                f"NATS at {self.description} does not answer JetStream requests ({exc!r}): "
                "is JetStream enabled (nats-server -js)?"
            ) from exc
        except (self._nats.errors.Error, OSError, asyncio.TimeoutError) as exc:
            if isinstance(exc, errors.APIError):
                raise
            raise BrokerUnavailable(f"lost NATS at {self.description}: {exc!r}") from exc

    async def publish(self, events: Sequence[OutboxEvent]) -> list[BaseException | None]:
        if not events:
            return []
        await self.connect()
        link = self._link
        assert link is not None
        lost = link.lost
        if not link.client.is_connected or lost.is_set():
            raise BrokerUnavailable(f"lost NATS at {self.description}: reconnecting")
        # Acks a dropped connection will never bring are not waited for until the timeout.
        sends = [asyncio.ensure_future(self._send(link.js, event)) for event in events]
        gathered = asyncio.gather(*sends, return_exceptions=True)
        watch = asyncio.ensure_future(lost.wait())
        either: list[asyncio.Future[Any]] = [gathered, watch]
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            gathered.cancel()
            raise
        finally:
            watch.cancel()
        if not gathered.done():
            for send in sends:
                send.cancel()
        replies = await gathered
        results: list[BaseException | None] = [
            None
            if not isinstance(reply, BaseException)
            else ConnectionError(f"lost NATS at {self.description} before the ack")
            if isinstance(reply, asyncio.CancelledError)
            else reply
            for reply in replies
        ]
        errors = self._nats.errors
        dropped = (errors.ConnectionClosedError, errors.ConnectionReconnectingError, errors.StaleConnectionError)
        first = results[0]
        if all(result is not None for result in results) and (
            lost.is_set() or not link.client.is_connected or all(isinstance(result, dropped) for result in results)
        ):
            raise BrokerUnavailable(f"lost NATS at {self.description}: {first!r}") from first
        return results

    async def _send(self, js: Any, event: OutboxEvent) -> Any:
        ident = str(event.id)
        headers = {
            **event.headers,
            "Nats-Msg-Id": ident,
            "dibs-event-id": ident,
            "dibs-aggregate-type": event.aggregate_type,
            "dibs-aggregate-id": event.aggregate_id,
            "dibs-event-type": event.event_type,
        }
        subject = self.subject(event)
        try:
            return await js.publish(subject, envelope(event).encode(), headers=headers)
        except self._nats.js.errors.NoStreamResponseError as exc:
            raise NoStream(f"no JetStream stream on {self.description} takes subject {subject!r}") from exc

    async def close(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            await link.client.close()
