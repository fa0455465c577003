"""What the outbox and relay tests share: a database per test with its outboxes and relays, relays in
threads and in processes of their own with short timings, and reading back what a broker was sent."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

import dibs
from dibs.outbox.publishers import Publisher
from dibs.schema import PUBLISHED
from dibs.schema import outbox as outbox_table
from tests.helpers import ServiceThread, wait_until
from tests.helpers.processes import ScriptProcess
from tests.queue.support import family_of

#: Relay timings that keep every test short: short leases, frequent upkeep, quick polls.
FAST_RELAY: dict[str, Any] = {"lease": 2.0, "poll": 0.05, "upkeep_every": 0.1, "grace": 5.0, "handle_signals": False}
#: Retries that come back almost at once.
QUICK_RETRY = dibs.Retry(base=0.05, factor=1.0, jitter=0.0)


class RelayThread(ServiceThread[dibs.RelayStats]):
    """A relay running in a thread of this process."""

    def __init__(self, relay: dibs.Relay) -> None:
        super().__init__(relay, relay.stop, "relay")
        self.relay = relay

    def start(self) -> RelayThread:
        self.thread.start()
        return self


class OutboxDatabase:
    """One test's database: outboxes and relays on it, all closed when the test ends."""

    def __init__(self, url: sa.URL) -> None:
        self.url = url
        self.family = family_of(url)
        self._engines: list[Engine] = []
        self._threads: list[RelayThread] = []
        self._relays: list[dibs.Relay] = []
        self.engine = self.new_engine()

    def new_engine(self) -> Engine:
        engine = dibs.create_engine(self.url)
        self._engines.append(engine)
        return engine

    def outbox(self, **options: Any) -> dibs.Outbox:
        """An Outbox on an engine of its own."""
        return dibs.Outbox(self.new_engine(), **options)

    def relay(self, outbox: dibs.Outbox, publisher: Publisher | str, **options: Any) -> dibs.Relay:
        """A relay with the test timings, unless overridden."""
        relay = outbox.relay(publisher, **{**FAST_RELAY, **options})
        self._relays.append(relay)
        return relay

    def start(self, outbox: dibs.Outbox, publisher: Publisher | str, **options: Any) -> RelayThread:
        """A relay running in a thread until stopped (or, with burst=True, until nothing is left)."""
        running = RelayThread(self.relay(outbox, publisher, **options)).start()
        self._threads.append(running)
        return running

    def drain(
        self, outbox: dibs.Outbox, publisher: Publisher | str, timeout: float = 30.0, **options: Any
    ) -> dibs.RelayStats:
        """Run a burst relay until nothing of its target is left to publish."""
        return self.start(outbox, publisher, burst=True, **options).join(timeout)

    def run_until(
        self,
        outbox: dibs.Outbox,
        publisher: Publisher | str,
        done: Callable[[], Any],
        timeout: float = 30.0,
        what: str = "",
        **options: Any,
    ) -> dibs.RelayStats:
        """Run a relay in a thread until ``done()`` holds, then stop it; what it did."""
        running = self.start(outbox, publisher, **options)
        wait_until(lambda: done() or not running.running, timeout=timeout, what=what or "the relay to be done")
        running.stop()
        stats = running.join(10)
        assert done(), f"the relay ended before it was done: {stats}"
        return stats

    def statuses(self) -> dict[int, str]:
        """Each event's status, by id."""
        with self.engine.connect() as conn:
            return {row.id: row.status for row in conn.execute(sa.select(outbox_table.c.id, outbox_table.c.status))}

    def all_published(self, count: int) -> bool:
        """Whether there are ``count`` events, all published."""
        found = self.statuses()
        return len(found) == count and set(found.values()) == {PUBLISHED}

    def rows(self, *where: Any) -> list[sa.Row[Any]]:
        """The outbox table's rows, in id order."""
        with self.engine.connect() as conn:
            return list(conn.execute(sa.select(outbox_table).where(*where).order_by(outbox_table.c.id)))

    def by_id(self) -> dict[int, sa.Row[Any]]:
        return {row.id: row for row in self.rows()}

    def count(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(outbox_table)).scalar_one())

    def close(self) -> None:
        for running in self._threads:
            running.stop()
        for relay in self._relays:
            # A relay closes its publisher when it ends; one that never ran (or failed to start) has not.
            if not any(running.relay is relay and running.error is None for running in self._threads):
                asyncio.run(relay.publisher.close())
        for engine in self._engines:
            engine.dispose()


def aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


# -- events ------------------------------------------------------------------------------------------------


def interleaved(aggregates: int, per_aggregate: int, *, aggregate_type: str = "order") -> list[dict[str, Any]]:
    """add_many() events of many aggregates, their events interleaved: a1 b1 c1 ... a2 b2 c2 ..."""
    return [
        {
            "aggregate_type": aggregate_type,
            "aggregate_id": f"agg-{a}",
            "event_type": "order.changed",
            "payload": {"aggregate": a, "step": step},
            "headers": {"trace-id": f"t-{a}-{step}"},
        }
        for step in range(per_aggregate)
        for a in range(aggregates)
    ]


def add_events(outbox: dibs.Outbox, events: Sequence[dict[str, Any]], per_transaction: int = 100) -> list[int]:
    """Add the events in transactions of ``per_transaction``; their ids, in order."""
    ids: list[int] = []
    for start in range(0, len(events), per_transaction):
        with outbox.engine.begin() as conn:
            ids += outbox.add_many(conn, events[start : start + per_transaction])
    return ids


# -- Redis -------------------------------------------------------------------------------------------------


def redis_publisher_url(redis_url: str, prefix: str) -> str:
    """A Redis Streams publisher URL whose streams are ``{prefix}.{aggregate_type}``."""
    return f"{redis_url}?stream={prefix}.{{aggregate_type}}"


async def _read_stream(url: str, key: str) -> list[tuple[str, dict[str, str]]]:
    import redis.asyncio as redis

    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return [(entry_id, fields) for entry_id, fields in await client.xrange(key) or []]
    finally:
        await client.aclose()


def read_stream(url: str, key: str) -> list[tuple[str, dict[str, str]]]:
    """(entry id, fields) of every entry of a Redis stream, in the order they were added."""
    return asyncio.run(_read_stream(url, key))


def entry_millis(entry_id: str) -> int:
    """When Redis added a stream entry, in milliseconds since the epoch (its id's first part)."""
    return int(entry_id.split("-")[0])


def ids_per_aggregate(entries: Sequence[tuple[str, dict[str, str]]]) -> dict[str, list[int]]:
    """The event ids of each aggregate, in the order the stream holds them."""
    found: dict[str, list[int]] = defaultdict(list)
    for _, fields in entries:
        found[fields["aggregate_id"]].append(int(fields["id"]))
    return dict(found)


# -- relays in processes of their own ----------------------------------------------------------------------


class RelayProcess(ScriptProcess):
    """A relay in an OS process of its own (tests.outbox.relay_process), with its files in a directory."""

    kind = "relay process"

    def __init__(self, directory: Path, name: str, db_url: sa.URL, publisher_url: str, *options: str) -> None:
        url = db_url.render_as_string(hide_password=False)
        super().__init__(directory, name, "tests.outbox.relay_process", url, publisher_url, "--name", name, *options)


# -- NATS JetStream and RabbitMQ ---------------------------------------------------------------------------


async def _nats_messages(url: str, stream: str) -> list[Any]:
    from tests.outbox.brokers import nats_client

    client = await nats_client(url)
    try:
        js = client.jetstream()
        info = await js.stream_info(stream)
        return [await js.get_msg(stream, seq) for seq in range(info.state.first_seq, info.state.last_seq + 1)]
    finally:
        await client.close()


def nats_messages(url: str, stream: str) -> list[Any]:
    """Every message of a JetStream stream, in the order it stored them."""
    return asyncio.run(_nats_messages(url, stream))


async def _declare_amqp(url: str, exchange: str, queue: str) -> None:
    import aio_pika

    connection = await aio_pika.connect(url, timeout=5)
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, durable=True)
        await channel.declare_exchange(exchange, aio_pika.ExchangeType.TOPIC, durable=True)
        await declared.bind(exchange, "#")
    finally:
        await connection.close()


def declare_amqp(url: str, exchange: str, queue: str) -> None:
    """A durable topic exchange with a durable queue bound to everything it routes."""
    asyncio.run(_declare_amqp(url, exchange, queue))


async def _take_amqp(url: str, queue: str) -> list[Any]:
    import aio_pika

    connection = await aio_pika.connect(url, timeout=5)
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        taken = []
        while (message := await declared.get(no_ack=True, fail=False)) is not None:
            taken.append(message)
        return taken
    finally:
        await connection.close()


def take_amqp(url: str, queue: str) -> list[Any]:
    """Every message waiting in the queue, in order (taken off it)."""
    return asyncio.run(_take_amqp(url, queue))
