"""Redis Streams: each event is one XADD, a batch one pipelined round trip.

``redis://host:6379/0?stream=dibs.{aggregate_type}&maxlen=1000000``: the stream name may use the event's
target, aggregate_type and event_type (default ``dibs.{aggregate_type}``), each escaped as in every
publisher's names (:func:`~dibs.outbox.publishers.base.token`), so that different values always make
different streams; ``maxlen`` trims each stream to about that many entries. Other options go to
redis-py. Each entry's fields are ``id`` (the event id, for consumers to drop duplicates),
``aggregate_type``, ``aggregate_id``, ``event_type``, ``payload`` (JSON), ``headers`` (JSON) and
``created_at`` (ISO 8601), as written. Entries of one aggregate are added in order.

The batch goes out on redis-py's blocking client, in a thread, rather than on its asyncio client: the
blocking client packs commands with hiredis (installed with ``dibs-sql[redis]``) and reads the replies of a
pipeline from one buffer, where the asyncio client packs each command in Python and reads each reply
under a timeout of its own, which cost more CPU than the rest of the relay.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from dibs._errors import InvalidArgument
from dibs.outbox.events import OutboxEvent
from dibs.outbox.publishers.base import BrokerUnavailable, Publisher, Template, redacted, split_options, whole_option


class RedisStreams(Publisher):
    def __init__(self, url: str) -> None:
        try:
            import redis
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise InvalidArgument("publishing to Redis needs redis-py: pip install 'dibs-sql[redis]'") from exc
        self._unreachable = (redis.ConnectionError, redis.TimeoutError, OSError)
        client_url, options = split_options(url, {"stream": "dibs.{aggregate_type}", "maxlen": None})
        self.stream = Template(options["stream"], "stream name")
        self.maxlen = whole_option(options, "maxlen", url)
        self.description = redacted(client_url)
        try:
            self._client: Any = redis.Redis.from_url(client_url)
        except ValueError as exc:
            raise InvalidArgument(f"{redacted(url)} is not a Redis URL ({exc}); write redis://host:6379/0") from exc

    async def connect(self) -> None:
        try:
            await asyncio.to_thread(self._client.ping)
        except self._unreachable as exc:
            raise BrokerUnavailable(f"cannot reach Redis at {self.description}: {exc}") from exc

    async def publish(self, events: Sequence[OutboxEvent]) -> list[BaseException | None]:
        return await asyncio.to_thread(self._publish, events)

    def _publish(self, events: Sequence[OutboxEvent]) -> list[BaseException | None]:
        pipeline = self._client.pipeline(transaction=False)
        for event in events:
            fields = {
                "id": event.id,
                "aggregate_type": event.aggregate_type,
                "aggregate_id": event.aggregate_id,
                "event_type": event.event_type,
                "payload": event.payload_json,
                "headers": json.dumps(event.headers) if event.headers else "{}",
                "created_at": event.created_at.isoformat(),
            }
            pipeline.xadd(self.stream(event), fields, maxlen=self.maxlen, approximate=True)
        try:
            replies = pipeline.execute(raise_on_error=False)
        except self._unreachable as exc:
            raise BrokerUnavailable(f"lost Redis at {self.description}: {exc}") from exc
        return [reply if isinstance(reply, BaseException) else None for reply in replies]

    async def close(self) -> None:
        await asyncio.to_thread(self._client.close)
