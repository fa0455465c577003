"""RabbitMQ: each event is one persistent message, published mandatory on a channel with publisher confirms.

``amqp://guest:guest@host:5672/vhost?exchange=dibs&exchange_type=topic&routing_key={aggregate_type}``
(``amqps://`` for TLS): ``exchange`` is declared durable on connecting, of ``exchange_type`` (default
``topic``); an exchange that exists must have that type. Without ``exchange`` (or with ``exchange=``)
messages go through the default exchange, so the routing key is a queue's name. The routing key may use
the event's target, aggregate_type and event_type (default ``{aggregate_type}``), each escaped into one
word (:func:`~dibs.outbox.publishers.base.token`: ``order.placed`` is ``order%2Eplaced``), so that a
value's ``.``, ``*`` or ``#`` never changes how a topic exchange routes it. ``timeout`` is how long
to wait for each confirm, in seconds (default 10); connecting waits at most 5. Other options go to
aio-pika (``heartbeat=``, ...).

Each message has ``message_id`` (the event id, for consumers to drop duplicates), ``type`` (the event
type), ``content_type`` ``application/json``, ``timestamp`` (created_at, to the second), and headers
``dibs-event-id``, ``dibs-aggregate-type``, ``dibs-aggregate-id`` after the event's own; its body is the
envelope. A message the broker nacks, or returns because no queue takes it, is an error for that event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

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

#: The longest wait for the broker to accept a connection, in seconds.
CONNECT_TIMEOUT = 5.0


class RabbitMQ(Publisher):
    def __init__(self, url: str) -> None:
        try:
            import aio_pika
            import aiormq.exceptions
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise InvalidArgument("publishing to RabbitMQ needs aio-pika: pip install 'dibs-sql[rabbitmq]'") from exc
        self._aio_pika = aio_pika
        self._errors = aiormq.exceptions
        client_url, options = split_options(
            url, {"exchange": "", "exchange_type": None, "routing_key": "{aggregate_type}", "timeout": "10"}
        )
        self.description = redacted(client_url)
        parts = urlsplit(client_url)
        try:
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number
        except ValueError as exc:
            raise InvalidArgument(f"{self.description} is not an AMQP URL ({exc}); write amqp://host:5672/") from exc
        if parts.scheme.lower() not in ("amqp", "amqps") or not parts.hostname:
            raise InvalidArgument(
                f"a RabbitMQ URL is amqp://user:password@host:5672/vhost (or amqps://), got {self.description}"
            )
        self._url = client_url
        self.exchange: str = options["exchange"]
        kinds = [kind.value for kind in aio_pika.ExchangeType]
        kind = options.get("exchange_type")
        if kind is not None and not self.exchange:
            raise InvalidArgument(
                f"exchange_type= needs exchange=, the name of the exchange to declare; got {redacted(url)}"
            )
        if kind is not None and kind not in kinds:
            raise InvalidArgument(f"exchange_type= must be one of {', '.join(kinds)}, got {kind!r}")
        self.exchange_type = aio_pika.ExchangeType(kind or "topic")
        self.routing_key = Template(options["routing_key"], "routing key")
        self.timeout = seconds_option(options, "timeout", url) or 10.0
        self._connection: Any = None
        self._channel: Any = None
        self._exchange: Any = None
        self._linking = asyncio.Lock()  # lanes that find no connection make one between them

    def _ready(self) -> bool:
        return not (
            self._connection is None or self._connection.is_closed or self._channel is None or self._channel.is_closed
        )

    async def connect(self) -> None:
        if not self._ready():
            async with self._linking:
                if not self._ready():
                    await self._connect()

    async def _connect(self) -> None:
        # Twice at most: the broker may close the whole connection as a channel is reopened after it closed
        # one (CHANNEL_ERROR), and a fresh connection then opens the channel.
        for attempt in (1, 2):
            if self._connection is None or self._connection.is_closed:
                try:
                    self._connection = await self._aio_pika.connect(
                        self._url, timeout=min(self.timeout, CONNECT_TIMEOUT)
                    )
                except (OSError, asyncio.TimeoutError, self._errors.AMQPError) as exc:
                    self._connection = None
                    raise BrokerUnavailable(f"cannot reach RabbitMQ at {self.description}: {exc!r}") from exc
            if self._channel is not None and not self._channel.is_closed:
                return
            try:
                await self._open_channel()
                return
            except BrokerUnavailable:
                await self.close()
                if attempt == 2:
                    raise
            except BaseException:
                await self.close()
                raise

    async def _open_channel(self) -> None:
        errors = self._errors
        try:
            channel = await self._connection.channel(publisher_confirms=True, on_return_raises=True)
            if self.exchange:
                try:
                    exchange = await channel.declare_exchange(self.exchange, self.exchange_type, durable=True)
                except errors.ChannelPreconditionFailed as exc:
                    raise InvalidArgument(
                        f"exchange {self.exchange!r} on {self.description} exists with other settings than "
                        f"a durable {self.exchange_type.value} exchange ({exc}); set exchange_type= to its type"
                    ) from exc
                except errors.ChannelAccessRefused:
                    # A user without the configure permission may still publish to an exchange that exists.
                    channel = await self._connection.channel(publisher_confirms=True, on_return_raises=True)
                    try:
                        exchange = await channel.get_exchange(self.exchange, ensure=True)
                    except errors.ChannelNotFoundEntity as exc:
                        raise InvalidArgument(
                            f"exchange {self.exchange!r} does not exist on {self.description}, and this user may "
                            "not declare it: declare it first, or give the user the configure permission"
                        ) from exc
            else:
                exchange = channel.default_exchange
        except (
            OSError,
            RuntimeError,  # aiormq: the connection is closed
            asyncio.TimeoutError,
            errors.AMQPConnectionError,
            errors.ChannelInvalidStateError,
        ) as exc:
            raise BrokerUnavailable(f"lost RabbitMQ at {self.description}: {exc!r}") from exc
        self._channel, self._exchange = channel, exchange

    async def publish(self, events: Sequence[OutboxEvent]) -> list[BaseException | None]:
        if not events:
            return []
        await self.connect()
        connection, exchange = self._connection, self._exchange
        replies = await asyncio.gather(*(self._send(exchange, event) for event in events), return_exceptions=True)
        results = [reply if isinstance(reply, BaseException) else None for reply in replies]
        # A dropped connection fails the sends with connection errors (OSError) before it counts as closed.
        if connection.is_closed or any(isinstance(result, OSError) for result in results):
            if self._connection is connection:  # else another batch saw it first
                await self.close()  # the next batch connects anew
            if all(result is not None for result in results):
                first = results[0]
                raise BrokerUnavailable(f"lost RabbitMQ at {self.description}: {first!r}") from first
        return results

    async def _send(self, exchange: Any, event: OutboxEvent) -> Any:
        aio_pika = self._aio_pika
        ident = str(event.id)
        message = aio_pika.Message(
            envelope(event).encode(),
            headers={
                **event.headers,
                "dibs-event-id": ident,
                "dibs-aggregate-type": event.aggregate_type,
                "dibs-aggregate-id": event.aggregate_id,
            },
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=ident,
            type=event.event_type,
            timestamp=event.created_at,
        )
        return await exchange.publish(message, self.routing_key(event), mandatory=True, timeout=self.timeout)

    async def close(self) -> None:
        connection, self._connection, self._channel, self._exchange = self._connection, None, None, None
        if connection is not None and not connection.is_closed:
            await connection.close()
