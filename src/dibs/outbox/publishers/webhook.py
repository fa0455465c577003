"""An HTTP webhook: one POST per event, the envelope as its JSON body.

``https://example.com/hooks/orders?timeout=10&concurrency=16``: the URL is the endpoint itself. dibs takes
``timeout`` (seconds to wait for each answer, default 10) and ``concurrency`` (requests in flight at
once, default 16) out of the query; the rest of the query stays part of the endpoint, as written (logs
show it as ``?...``). A user and password in the URL are sent as HTTP basic auth. The URL takes no
fields of the event (``{aggregate_type}`` in it is refused): every event goes to the one endpoint, and
the headers below say what it is.

Each request carries ``Content-Type: application/json``, ``Dibs-Event-Id`` and ``Idempotency-Key`` (both
the event id, for the receiver to drop duplicates), ``Dibs-Event-Type``, ``Dibs-Aggregate-Type`` and
``Dibs-Aggregate-Id``, after the event's own headers. A 2xx answer confirms the event; any other
answer, redirects included, is an error for that event alone. When no request of a batch gets through
(refused, connect timeout, dropped without an answer) the endpoint counts as unavailable.

httpx logs every request at INFO; the publisher's own requests are kept out of the logs (the relay logs
per batch), unless the ``httpx`` logger's own level is set to INFO or lower. The application's other
httpx requests log as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any
from urllib.parse import unquote_plus, urlsplit, urlunsplit

from dibs._errors import InvalidArgument
from dibs.outbox.events import OutboxEvent
from dibs.outbox.publishers.base import (
    TEMPLATE_FIELDS,
    BrokerUnavailable,
    Publisher,
    envelope,
    redacted,
    seconds_option,
    split_options,
    whole_option,
)

#: True while a webhook publisher sends: the requests httpx logs then are the publisher's own.
_sending: ContextVar[bool] = ContextVar("dibs_webhook_sending", default=False)


class _PerRequestLines(logging.Filter):
    """Drops httpx's INFO line per request of the webhook publisher, unless the httpx logger's level asks for it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING or not _sending.get():
            return True
        level = logging.getLogger(record.name).level
        return level != logging.NOTSET and level <= record.levelno


_PER_REQUEST_LINES = _PerRequestLines()


class WebhookRejected(Exception):
    """The endpoint answered with a status other than 2xx."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class Webhook(Publisher):
    def __init__(self, url: str) -> None:
        try:
            import httpx
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise InvalidArgument("publishing to a webhook needs httpx: pip install 'dibs-sql[webhook]'") from exc
        self._httpx = httpx
        ours = {"timeout": "10", "concurrency": "16"}
        _, options = split_options(url, ours)
        self.timeout = seconds_option(options, "timeout", url) or 10.0
        self.concurrency = whole_option(options, "concurrency", url) or 16
        # The endpoint keeps the rest of its query byte for byte (split_options would decode it).
        parts = urlsplit(url)
        query = "&".join(
            item for item in parts.query.split("&") if item and unquote_plus(item.split("=", 1)[0]) not in ours
        )
        endpoint = urlunsplit(parts._replace(query=query))
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            raise InvalidArgument(f"a webhook URL is http://host/path or https://host/path, got {redacted(url)}")
        fields = [name for name in TEMPLATE_FIELDS if "{" + name + "}" in url]
        if fields:
            raise InvalidArgument(
                f"a webhook URL takes no event fields, got {', '.join('{' + name + '}' for name in fields)} in "
                f"{redacted(url)}; every event goes to the one endpoint, with its Dibs-Aggregate-Type and "
                "Dibs-Event-Type headers"
            )
        try:
            self._url = httpx.URL(endpoint)
        except httpx.InvalidURL as exc:
            raise InvalidArgument(f"{redacted(url)} is not a URL ({exc}); write https://host/path") from exc
        # Logs name the endpoint without its query, which may hold a secret (a token, a signature).
        self.description = redacted(urlunsplit(parts._replace(query="", fragment=""))) + ("?..." if query else "")
        self._client: Any = None
        self._slots: asyncio.Semaphore | None = None

    async def connect(self) -> None:
        """Make the HTTP client; nothing is sent until the first batch."""
        if self._client is None:
            httpx = self._httpx
            logging.getLogger("httpx").addFilter(_PER_REQUEST_LINES)  # once: a filter is added only if absent
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout),
                limits=httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency),
                follow_redirects=False,
            )
            self._slots = asyncio.Semaphore(self.concurrency)

    async def publish(self, events: Sequence[OutboxEvent]) -> list[BaseException | None]:
        if not events:
            return []
        await self.connect()
        client, slots = self._client, self._slots
        assert slots is not None
        sending = _sending.set(True)  # the requests' tasks copy the context as they are made
        try:
            results: list[BaseException | None] = await asyncio.gather(
                *(self._post(client, slots, event) for event in events), return_exceptions=True
            )
        finally:
            _sending.reset(sending)
        unreachable = (self._httpx.ConnectError, self._httpx.ConnectTimeout, self._httpx.RemoteProtocolError)
        first = results[0]
        if isinstance(first, unreachable) and all(isinstance(result, unreachable) for result in results):
            raise BrokerUnavailable(f"cannot reach the webhook {self.description}: {first!r}") from first
        return results

    async def _post(self, client: Any, slots: asyncio.Semaphore, event: OutboxEvent) -> None:
        headers = self._httpx.Headers(event.headers)
        ident = str(event.id)
        headers.update(
            {
                "Content-Type": "application/json",
                "Dibs-Event-Id": ident,
                "Idempotency-Key": ident,
                "Dibs-Event-Type": event.event_type,
                "Dibs-Aggregate-Type": event.aggregate_type,
                "Dibs-Aggregate-Id": event.aggregate_id,
            }
        )
        async with slots:
            response = await client.post(self._url, content=envelope(event).encode(), headers=headers)
        if not 200 <= response.status_code < 300:
            excerpt = " ".join(response.text.split())[:200]
            raise WebhookRejected(
                f"the webhook {self.description} answered {response.status_code} to event {event.id}"
                + (f": {excerpt}" if excerpt else ""),
                response.status_code,
            )

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()
