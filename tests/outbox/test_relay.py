"""Relays against real brokers on every backend: everything published at least once, in order per aggregate
and never two of one aggregate at once (seen from the broker's side), in parallel across aggregates;
retries, abandonment and requeue; a relay killed mid-batch; a broker that goes away; a graceful stop."""

from __future__ import annotations

import itertools
import json
import logging
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

import dibs
from dibs.schema import outbox as outbox_table
from tests.helpers import wait_until
from tests.outbox.brokers import CLOSED_PORT, Names, Proxy, WebhookServer, with_options
from tests.outbox.support import (
    OutboxDatabase,
    RelayProcess,
    add_events,
    aware,
    declare_amqp,
    entry_millis,
    ids_per_aggregate,
    interleaved,
    nats_messages,
    read_stream,
    redis_publisher_url,
    take_amqp,
)
from tests.queue.support import database_now


def expected_per_aggregate(odb: OutboxDatabase, target: str = "default") -> dict[str, list[int]]:
    """The ids of each aggregate's events of a target, in creation order, as the database holds them."""
    found: dict[str, list[int]] = defaultdict(list)
    for row in odb.rows(outbox_table.c.target == target):
        found[row.aggregate_id].append(row.id)
    return dict(found)


def assert_in_order_once(seen: dict[str, list[int]], expected: dict[str, list[int]]) -> None:
    """Each aggregate's events arrived once each, in creation order."""
    assert sorted(seen) == sorted(expected)
    for aggregate, ids in expected.items():
        assert seen[aggregate] == ids, f"aggregate {aggregate}: arrived as {seen[aggregate]}, created as {ids}"


def published(odb: OutboxDatabase, ids: Sequence[int]) -> Callable[[], bool]:
    """Whether every one of these events is published."""
    return lambda: all(status == "published" for status in map(odb.statuses().get, ids))


@pytest.fixture
def processes() -> Iterator[list[RelayProcess]]:
    """Relay processes started by the test; any still running at the end is killed."""
    started: list[RelayProcess] = []
    yield started
    for process in started:
        process.close()


def wait_ready(relays: Sequence[RelayProcess], timeout: float = 30.0) -> None:
    for relay in relays:
        wait_until(lambda relay=relay: relay.ready.exists() or not relay.alive(), timeout=timeout, what="relay ready")
        assert relay.alive(), relay.output()


# -- Redis Streams: everything, with its fields ------------------------------------------------------------


def test_a_relay_publishes_every_event_with_its_id_and_fields(
    odb: OutboxDatabase, redis_url: str, redis_prefix: str
) -> None:
    outbox = odb.outbox()
    with outbox.engine.begin() as conn:
        ids = outbox.add_many(
            conn,
            [
                {
                    "aggregate_type": kind,
                    "aggregate_id": f"{kind}-{n % 2}",
                    "event_type": f"{kind}.step{n}",
                    "payload": {"n": n, "text": "café ✓", "list": [1, None, True]},
                    "headers": {"trace-id": f"trace-{n}"} if n % 2 else None,
                }
                for n in range(6)
                for kind in ("order", "user")
            ],
        )
        other = outbox.add(conn, "order", "order-0", "order.audited", {}, target="audit")
    started = database_now(odb.engine)

    stats = odb.run_until(outbox, redis_publisher_url(redis_url, redis_prefix), published(odb, ids))

    assert (stats.claimed, stats.published, stats.retried, stats.abandoned, stats.released, stats.lost) == (
        12,
        12,
        0,
        0,
        0,
        0,
    )
    events = {event.id: event for event in outbox.events(limit=100)}
    assert events[other].status == "pending", "a relay of the default target published another target's event"
    for event_id in ids:
        event = events[event_id]
        assert (event.status, event.retry_count, event.attempts, event.last_error) == ("published", 0, 1, None)
        assert event.published_at is not None
        assert started <= event.published_at <= database_now(odb.engine)
    expected = expected_per_aggregate(odb)
    for kind in ("order", "user"):
        entries = read_stream(redis_url, f"{redis_prefix}.{kind}")
        assert len(entries) == 6
        for _, fields in entries:
            event = events[int(fields["id"])]
            assert fields == {
                "id": str(event.id),
                "aggregate_type": kind,
                "aggregate_id": event.aggregate_id,
                "event_type": event.event_type,
                "payload": event.payload_json,
                "headers": json.dumps(event.headers) if event.headers else "{}",
                "created_at": event.created_at.isoformat(),
            }
        assert_in_order_once(
            ids_per_aggregate(entries), {agg: got for agg, got in expected.items() if agg.startswith(kind)}
        )


def test_a_burst_relay_returns_once_nothing_is_left(odb: OutboxDatabase, redis_url: str, redis_prefix: str) -> None:
    outbox = odb.outbox()
    ids = add_events(outbox, interleaved(aggregates=4, per_aggregate=3))
    stats = odb.drain(outbox, redis_publisher_url(redis_url, redis_prefix), timeout=3)
    assert stats.published == 12
    assert published(odb, ids)()
    assert len(read_stream(redis_url, f"{redis_prefix}.order")) == 12


# -- order per aggregate, several relay processes at once --------------------------------------------------


def test_several_relay_processes_publish_each_aggregate_in_order(
    odb: OutboxDatabase, redis_url: str, redis_prefix: str, processes: list[RelayProcess], tmp_path: Path
) -> None:
    url = redis_publisher_url(redis_url, redis_prefix)
    for n in range(3):
        processes.append(
            RelayProcess(tmp_path, f"relay-{n}", odb.url, url, "--batch", "8", "--concurrency", "2", "--jitter", "0.04")
        )
    wait_ready(processes)
    outbox = odb.outbox()
    # While the relays run: 40 aggregates, 8 events each, interleaved, in transactions of one event each.
    ids = add_events(outbox, interleaved(aggregates=40, per_aggregate=8), per_transaction=40)

    wait_until(published(odb, ids), timeout=60, what="every event to be published")
    for relay in processes:
        relay.terminate()
    for relay in processes:
        assert relay.wait(15) == 0, relay.output()

    stats = [relay.stats() for relay in processes]
    assert sum(each["published"] for each in stats) == 320
    assert all(each["published"] > 0 for each in stats), f"a relay published nothing: {stats}"
    assert sum(each["lost"] + each["retried"] + each["abandoned"] for each in stats) == 0
    entries = read_stream(redis_url, f"{redis_prefix}.order")
    assert len(entries) == 320
    assert_in_order_once(ids_per_aggregate(entries), expected_per_aggregate(odb))


# -- never two of one aggregate at once; different aggregates in parallel ----------------------------------


@dataclass
class Visit:
    event_id: int
    aggregate: str
    start: float
    end: float
    status: int


@dataclass
class Recorder:
    """Answers the webhook's requests after a pause, recording when each began and ended."""

    pause: float
    status_for: Callable[[Any], int] = lambda body: 200
    visits: list[Visit] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, body: Any) -> int:
        start = time.monotonic()
        time.sleep(self.pause)
        status = self.status_for(body)
        end = time.monotonic()
        with self.lock:
            self.visits.append(Visit(body["id"], body["aggregate_id"], start, end, status))
        return status

    def of(self, aggregate: str) -> list[Visit]:
        with self.lock:
            return sorted((visit for visit in self.visits if visit.aggregate == aggregate), key=lambda v: v.start)

    def ids_of(self, aggregate: str) -> list[tuple[int, int]]:
        """(event id, status answered) of the aggregate's requests, in the order they came."""
        return [(visit.event_id, visit.status) for visit in self.of(aggregate)]


def test_no_two_events_of_an_aggregate_are_in_flight_at_once_but_aggregates_go_in_parallel(
    odb: OutboxDatabase, webhook_server: WebhookServer
) -> None:
    recorder = Recorder(pause=0.03)
    webhook_server.respond = recorder
    outbox = odb.outbox()
    relays = [odb.start(outbox, webhook_server.url, batch=4, concurrency=3) for _ in range(3)]
    # Every relay running before the events come, and more aggregates than one relay holds at once (its
    # batch plus what its runners hold): otherwise the relay that starts or wakes first can take every
    # head, and publish them all before the others look.
    wait_until(lambda: all(relay.relay._loop is not None for relay in relays), what="the relays to start")
    time.sleep(0.3)
    ids = add_events(outbox, interleaved(aggregates=24, per_aggregate=3))

    wait_until(published(odb, ids), timeout=30, what="every event to be published")
    for relay in relays:
        relay.stop()
    stats = [relay.join(10) for relay in relays]

    assert sum(each.published for each in stats) == len(ids)
    assert sum(1 for each in stats if each.published) >= 2, f"the relays did not share the work: {stats}"
    assert Counter(visit.event_id for visit in recorder.visits) == dict.fromkeys(ids, 1)
    expected = expected_per_aggregate(odb)
    for aggregate, aggregate_ids in expected.items():
        visits = recorder.of(aggregate)
        assert [visit.event_id for visit in visits] == aggregate_ids
        for before, after in itertools.pairwise(visits):
            assert before.end <= after.start, f"events {before.event_id} and {after.event_id} of {aggregate} overlapped"
    overlapping = {
        (a.aggregate, b.aggregate)
        for a in recorder.visits
        for b in recorder.visits
        if a.aggregate < b.aggregate and a.start < b.end and b.start < a.end
    }
    assert len(overlapping) >= 3, "different aggregates were not published in parallel"
    assert webhook_server.most_in_flight > 1


# -- at least once: a relay killed between publish and mark ------------------------------------------------


def test_a_relay_killed_between_publish_and_mark_has_its_batch_published_again_after_its_lease(
    odb: OutboxDatabase, redis_url: str, redis_prefix: str, processes: list[RelayProcess], tmp_path: Path
) -> None:
    outbox = odb.outbox()
    ids = add_events(outbox, interleaved(aggregates=12, per_aggregate=3))
    url = redis_publisher_url(redis_url, redis_prefix)
    frozen_file = tmp_path / "frozen.json"
    killed = RelayProcess(
        tmp_path,
        "killed",
        odb.url,
        url,
        "--batch",
        "5",
        "--lease",
        "2.5",
        "--freeze-after",
        "3",
        "--frozen",
        str(frozen_file),
    )
    processes.append(killed)
    wait_until(lambda: frozen_file.exists() or not killed.alive(), timeout=30, what="the third batch to be published")
    assert killed.alive(), killed.output()
    frozen = set(json.loads(frozen_file.read_text()))
    killed.kill()
    assert killed.wait(10) == -signal.SIGKILL

    # The third batch is in the broker and still held by the dead relay; the two before it are marked.
    rows = odb.by_id()
    marked = {event_id for event_id, row in rows.items() if row.status == "published"}
    assert len(frozen) == 5
    assert len(marked) == 10
    for event_id in frozen:
        assert (rows[event_id].status, rows[event_id].lease_owner) == ("processing", "killed")
    assert {rows[event_id].status for event_id in set(ids) - marked - frozen} == {"pending"}
    entries = read_stream(redis_url, f"{redis_prefix}.order")
    assert sorted(int(fields["id"]) for _, fields in entries) == sorted(marked | frozen)
    expires_at = max(aware(row.lease_expires_at) for row in rows.values() if row.id in frozen)

    # Another relay publishes the rest at once, but the dead relay's events (and their aggregates' later
    # events, which wait behind them) only once its lease has expired.
    second = odb.start(outbox, url, batch=5)
    blocked = {row.id for row in rows.values() if row.aggregate_id in {rows[i].aggregate_id for i in frozen}}
    free = set(ids) - marked - blocked
    wait_until(published(odb, sorted(free)), timeout=20, what="the events no dead lease holds up")
    assert database_now(odb.engine) < expires_at, "the test was too slow to see the lease still held"
    rows = odb.by_id()
    for event_id in frozen:
        assert (rows[event_id].status, rows[event_id].lease_owner) == ("processing", "killed")
    assert {rows[event_id].status for event_id in blocked - frozen - marked} == {"pending"}

    wait_until(published(odb, ids), timeout=20, what="every event to be published")
    second.stop()
    stats = second.join(10)
    assert (stats.published, stats.lost, stats.retried) == (len(ids) - len(marked), 0, 0)

    entries = read_stream(redis_url, f"{redis_prefix}.order")
    times = Counter(int(fields["id"]) for _, fields in entries)
    assert set(times) == set(ids), "an event was lost"
    assert {event_id for event_id, count in times.items() if count > 1} == frozen
    assert {times[event_id] for event_id in frozen} == {2}
    deadline = int(expires_at.timestamp() * 1000)
    for event_id in frozen:
        _, again = [entry_id for entry_id, fields in entries if int(fields["id"]) == event_id]
        assert entry_millis(again) >= deadline, f"event {event_id} was taken over before its lease expired"
    for aggregate, seen in ids_per_aggregate(entries).items():
        assert seen == sorted(seen), f"aggregate {aggregate} went out of order: {seen}"
    for row in odb.rows():
        assert row.attempts == (2 if row.id in frozen else 1)
        assert row.retry_count == 0


# -- retries, abandonment and requeue ----------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["block", "skip"])
def test_a_failing_event_is_retried_then_abandoned_and_published_once_requeued(
    odb: OutboxDatabase, webhook_server: WebhookServer, policy: str
) -> None:
    outbox = odb.outbox(on_failed_head=policy, max_retries=2, retry=dibs.Retry(base=0.2, factor=1.0, jitter=0.0))
    with outbox.engine.begin() as conn:
        a1, a2, a3 = (outbox.add(conn, "order", "A", f"order.e{n}", {"n": n}) for n in range(3))
        b1, b2 = (outbox.add(conn, "order", "B", f"order.e{n}", {"n": n}) for n in range(2))
    refused = {a1}
    recorder = Recorder(pause=0.0, status_for=lambda body: 500 if body["id"] in refused else 200)
    webhook_server.respond = recorder

    seen: set[tuple[str, int]] = set()

    def a1_abandoned() -> bool:
        event = outbox.get(a1)
        seen.add((event.status, event.retry_count))
        return event.status == "abandoned"

    relay = odb.start(outbox, webhook_server.url, batch=10)
    wait_until(a1_abandoned, timeout=20, interval=0.01, what="the failing event to be abandoned")
    wait_until(published(odb, [b1, b2] if policy == "block" else [b1, b2, a2, a3]), timeout=10)
    time.sleep(0.5)  # the relay goes on polling meanwhile

    assert {("failed", 1), ("failed", 2)} <= seen, f"the failing event was never seen waiting to retry: {seen}"
    event = outbox.get(a1)
    assert (event.status, event.retry_count, event.attempts) == ("abandoned", 3, 3)
    assert event.last_error is not None
    assert "WebhookRejected" in event.last_error
    assert "answered 500" in event.last_error
    assert recorder.ids_of("B") == [(b1, 200), (b2, 200)]
    if policy == "block":
        assert recorder.ids_of("A") == [(a1, 500)] * 3, "events behind a failing head went ahead"
        assert [outbox.get(i).status for i in (a2, a3)] == ["pending", "pending"]
    else:
        # a2 and a3 went ahead, in their order, while a1 still waited for its retries.
        sent = recorder.ids_of("A")
        assert [visit for visit in sent if visit[0] == a1] == [(a1, 500)] * 3
        assert [visit for visit in sent if visit[0] != a1] == [(a2, 200), (a3, 200)]
        assert sent.index((a2, 200)) < 2, f"a2 waited for a1's retries: {sent}"
    assert relay.relay.stats.retried == 2
    assert relay.relay.stats.abandoned == 1

    refused.clear()
    assert outbox.requeue([a1]) == 1
    wait_until(published(odb, [a1, a2, a3, b1, b2]), timeout=10, what="the requeued event to be published")
    relay.stop()
    stats = relay.join(10)
    assert (stats.published, stats.retried, stats.abandoned, stats.lost) == (5, 2, 1, 0)
    event = outbox.get(a1)
    assert (event.status, event.retry_count, event.last_error) == ("published", 0, None)
    if policy == "block":
        assert recorder.ids_of("A") == [(a1, 500)] * 3 + [(a1, 200), (a2, 200), (a3, 200)]
    else:
        assert recorder.ids_of("A")[-1] == (a1, 200)


def test_an_error_the_retry_policy_does_not_retry_abandons_at_once(
    odb: OutboxDatabase, webhook_server: WebhookServer
) -> None:
    outbox = odb.outbox(max_retries=5, retry=dibs.Retry(base=0.05, on=(ConnectionError,)))
    first = outbox.add(outbox.engine, "order", "A", "order.placed", {})
    webhook_server.reject(first, status=422)
    stats = odb.run_until(outbox, webhook_server.url, lambda: outbox.get(first).status == "abandoned")
    event = outbox.get(first)
    assert (event.retry_count, stats.retried, stats.abandoned) == (1, 0, 1)
    assert event.last_error is not None
    assert "422" in event.last_error


# -- the broker away -----------------------------------------------------------------------------------------


def test_a_relay_that_cannot_reach_its_broker_claims_nothing_and_says_so(
    odb: OutboxDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dibs.relay")
    outbox = odb.outbox()
    ids = add_events(outbox, interleaved(aggregates=3, per_aggregate=2))
    relay = odb.start(outbox, f"redis://127.0.0.1:{CLOSED_PORT}/0")
    wait_until(
        lambda: any(record.levelno == logging.ERROR for record in caplog.records), timeout=10, what="an error logged"
    )
    time.sleep(0.3)
    errors = [record.getMessage() for record in caplog.records if record.levelno == logging.ERROR]
    assert f"cannot reach Redis at redis://127.0.0.1:{CLOSED_PORT}/0" in errors[0]
    assert "trying again" in errors[0]
    for row in odb.rows():
        assert (row.status, row.attempts, row.retry_count, row.lease_owner) == ("pending", 0, 0, None)
    assert relay.relay.stats.claimed == 0
    relay.relay.stop()
    relay.thread.join(10)
    assert not relay.running, "the relay did not stop while it waited for its broker"
    assert len(ids) == odb.count()


def test_a_relay_stopped_while_it_waits_for_its_broker_returns_normally(odb: OutboxDatabase) -> None:
    outbox = odb.outbox()
    outbox.add(outbox.engine, "order", "A", "order.placed", {})
    relay = odb.start(outbox, f"redis://127.0.0.1:{CLOSED_PORT}/0")
    time.sleep(0.3)
    relay.stop()
    stats = relay.join(10)  # raises what run() raised
    assert stats.claimed == 0


def test_a_burst_relay_that_cannot_reach_its_broker_gives_up_at_once(odb: OutboxDatabase) -> None:
    outbox = odb.outbox()
    outbox.add(outbox.engine, "order", "A", "order.placed", {})
    running = odb.start(outbox, f"redis://127.0.0.1:{CLOSED_PORT}/0", burst=True)
    with pytest.raises(dibs.BrokerUnavailable, match=f"127.0.0.1:{CLOSED_PORT}"):
        running.join(10)
    (row,) = odb.rows()
    assert (row.status, row.attempts, row.retry_count) == ("pending", 0, 0)


def test_events_are_given_back_while_the_broker_is_away_and_published_when_it_is_back(
    odb: OutboxDatabase,
    redis_url: str,
    redis_prefix: str,
    proxy: Callable[[str, int], Proxy],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="dibs.relay")
    parts = urlsplit(redis_url)
    assert parts.hostname is not None
    assert parts.port is not None
    gate = proxy(parts.hostname, parts.port)
    url = redis_publisher_url(f"redis://127.0.0.1:{gate.port}{parts.path}", redis_prefix)
    outbox = odb.outbox()
    before = add_events(outbox, interleaved(aggregates=4, per_aggregate=2))
    relay = odb.start(outbox, url, batch=5)
    wait_until(published(odb, before), timeout=20, what="the first events to be published")

    gate.cut()
    during = add_events(outbox, interleaved(aggregates=4, per_aggregate=2))
    wait_until(lambda: relay.relay.stats.released > 0, timeout=20, what="a batch to be given back")
    rows = odb.by_id()
    for event_id in during:
        row = rows[event_id]
        assert row.status in ("pending", "processing")
        assert (row.retry_count, row.last_error) == (0, None)
    errors = [record.getMessage() for record in caplog.records if record.levelno == logging.ERROR]
    assert any("lost Redis" in error and "given back unpublished" in error for error in errors), errors

    gate.resume()
    wait_until(published(odb, before + during), timeout=30, what="everything to be published once Redis is back")
    relay.stop()
    stats = relay.join(10)
    assert (stats.published, stats.retried, stats.abandoned, stats.lost) == (16, 0, 0, 0)
    assert stats.released > 0
    for row in odb.rows():
        assert (row.retry_count, row.last_error) == (0, None)
    assert any("the broker is back" in record.getMessage() for record in caplog.records)
    entries = read_stream(redis_url, f"{redis_prefix}.order")
    assert_in_order_once(ids_per_aggregate(entries), expected_per_aggregate(odb))


# -- bad arguments ---------------------------------------------------------------------------------------------


#: (a publisher URL, relay options, what the InvalidArgument says)
BAD_RELAYS: list[tuple[str, dict[str, Any], str]] = [
    ("kafka://127.0.0.1:9092", {}, "Kafka"),
    ("mqtt://127.0.0.1:1883", {}, "supported schemes"),
    ("127.0.0.1:6379", {}, "URL"),
    ("redis://127.0.0.1:6379/0?stream=dibs.{nope}", {}, "{nope}"),
    ("log://", {"batch": 0}, "batch"),
    ("log://", {"concurrency": True}, "concurrency"),
    ("log://", {"lease": 1.0, "heartbeat": 1.0}, "heartbeat"),
    ("log://", {"lease": timedelta(seconds=30), "heartbeat": 40}, "shorter than the lease (30 s), got 40"),
    ("log://", {"poll": 0}, "poll"),
    ("log://", {"grace": -1}, "grace"),
    ("log://", {"target": ""}, "target"),
]


def made_relay(outbox: dibs.Outbox, publisher: str, options: dict[str, Any]) -> BaseException | None:
    try:
        outbox.relay(publisher, **options)
    except Exception as exc:
        return exc
    return None


def test_a_bad_publisher_or_option_is_an_invalid_argument_before_anything_is_claimed(odb: OutboxDatabase) -> None:
    outbox = odb.outbox()
    outbox.add(outbox.engine, "order", "A", "order.placed", {})
    wrong = []
    for publisher, options, says in BAD_RELAYS:
        error = made_relay(outbox, publisher, options)
        if not isinstance(error, dibs.InvalidArgument) or says not in str(error):
            wrong.append(f"{publisher} {options}: {error!r}, expected an InvalidArgument saying {says!r}")
    assert wrong == []
    (row,) = odb.rows()
    assert (row.status, row.attempts) == ("pending", 0)


# -- a graceful stop -------------------------------------------------------------------------------------------


def test_stop_lets_the_batch_in_flight_finish_within_the_grace(
    odb: OutboxDatabase, webhook_server: WebhookServer
) -> None:
    recorder = Recorder(pause=1.0)
    webhook_server.respond = recorder
    outbox = odb.outbox()
    ids = add_events(outbox, interleaved(aggregates=12, per_aggregate=1))
    relay = odb.start(outbox, webhook_server.url, batch=5, grace=5.0)
    wait_until(lambda: webhook_server.in_flight == 5, timeout=10, what="a batch to be in flight")
    stopped = time.monotonic()
    relay.stop()
    stats = relay.join(10)
    assert time.monotonic() - stopped < 5.0
    assert (stats.claimed, stats.published, stats.released) == (5, 5, 0)
    statuses = odb.statuses()
    sent = {visit.event_id for visit in recorder.visits}
    assert len(sent) == 5
    assert all(statuses[event_id] == "published" for event_id in sent)
    for row in odb.rows():
        if row.id not in sent:
            assert (row.status, row.attempts) == ("pending", 0)
    assert len(ids) == 12


def test_a_stop_in_a_hurry_cuts_the_grace_short_and_gives_the_batch_in_flight_back(
    odb: OutboxDatabase, webhook_server: WebhookServer
) -> None:
    webhook_server.respond = Recorder(pause=3.0)
    outbox = odb.outbox()
    add_events(outbox, interleaved(aggregates=5, per_aggregate=1))
    relay = odb.start(outbox, webhook_server.url, batch=5, grace=30.0)
    wait_until(lambda: webhook_server.in_flight == 5, timeout=10, what="a batch to be in flight")
    relay.relay.stop()
    time.sleep(0.2)  # the graceful stop has begun: the relay waits out the grace for its batch
    assert relay.running
    stopped = time.monotonic()
    relay.relay.stop(hurry=True)
    stats = relay.join(10)
    assert time.monotonic() - stopped < 2.0
    assert (stats.claimed, stats.published, stats.released) == (5, 0, 5)
    assert {row.status for row in odb.rows()} == {"pending"}


def test_a_batch_slower_than_the_grace_is_given_back(odb: OutboxDatabase, webhook_server: WebhookServer) -> None:
    webhook_server.respond = Recorder(pause=1.0)
    outbox = odb.outbox()
    ids = add_events(outbox, interleaved(aggregates=4, per_aggregate=1))
    relay = odb.start(outbox, webhook_server.url, batch=4, grace=0.2)
    wait_until(lambda: webhook_server.in_flight == 4, timeout=10, what="a batch to be in flight")
    relay.stop()
    stats = relay.join(5)
    assert (stats.claimed, stats.published, stats.released) == (4, 0, 4)
    for row in odb.rows():
        assert (row.status, row.attempts, row.retry_count, row.lease_owner) == ("pending", 0, 0, None)
    assert len(ids) == 4


def test_sigterm_lets_a_relay_process_finish_its_batch_and_exit(
    odb: OutboxDatabase, redis_url: str, redis_prefix: str, processes: list[RelayProcess], tmp_path: Path
) -> None:
    outbox = odb.outbox()
    ids = add_events(outbox, interleaved(aggregates=12, per_aggregate=1))
    publishing = tmp_path / "publishing.json"
    grace = 5.0
    relay = RelayProcess(
        tmp_path,
        "terminated",
        odb.url,
        redis_publisher_url(redis_url, redis_prefix),
        "--batch",
        "5",
        "--slow",
        "1.0",
        "--publishing",
        str(publishing),
        "--grace",
        str(grace),
        "--lease",
        "30",
    )
    processes.append(relay)
    wait_until(lambda: publishing.exists() or not relay.alive(), timeout=30, what="a batch to be publishing")
    assert relay.alive(), relay.output()
    in_flight = set(json.loads(publishing.read_text()))
    relay.terminate()
    sent = time.monotonic()
    assert relay.wait(grace + 5) == 0, relay.output()
    assert time.monotonic() - sent < grace, relay.output()

    stats = relay.stats()
    assert (stats["claimed"], stats["published"], stats["released"]) == (5, 5, 0)
    statuses = odb.statuses()
    assert {event_id for event_id, status in statuses.items() if status == "published"} == in_flight
    for row in odb.rows():
        if row.id not in in_flight:
            assert (row.status, row.attempts, row.lease_owner) == ("pending", 0, None)
    entries = read_stream(redis_url, f"{redis_prefix}.order")
    assert sorted(int(fields["id"]) for _, fields in entries) == sorted(in_flight)
    assert len(ids) == 12


# -- NATS JetStream and RabbitMQ, end to end (on SQLite) -------------------------------------------------------


@pytest.mark.parametrize("outbox_url", ["sqlite"], indirect=True)
def test_a_relay_to_nats_jetstream_publishes_every_event_in_order(
    odb: OutboxDatabase, nats_url: str, nats_names: Names
) -> None:
    stream = nats_names.name("stream")
    url = with_options(nats_url, subject=nats_names.tag + ".{aggregate_type}", stream=stream)
    outbox = odb.outbox()
    ids = add_events(outbox, interleaved(aggregates=5, per_aggregate=4))
    stats = odb.run_until(outbox, url, published(odb, ids), batch=3, concurrency=2)
    assert stats.published == 20

    messages = nats_messages(nats_url, stream)
    assert len(messages) == 20
    seen: dict[str, list[int]] = defaultdict(list)
    events = {event.id: event for event in outbox.events(limit=100)}
    for message in messages:
        body = json.loads(message.data)
        event = events[body["id"]]
        assert message.subject == f"{nats_names.tag}.order"
        assert message.headers["Nats-Msg-Id"] == str(event.id)
        assert (body["aggregate_id"], body["event_type"], body["payload"]) == (
            event.aggregate_id,
            event.event_type,
            event.payload,
        )
        seen[body["aggregate_id"]].append(body["id"])
    assert_in_order_once(dict(seen), expected_per_aggregate(odb))


@pytest.mark.parametrize("outbox_url", ["sqlite"], indirect=True)
def test_a_relay_to_rabbitmq_publishes_every_event_in_order(
    odb: OutboxDatabase, amqp_url: str, amqp_names: Names
) -> None:
    exchange, queue = amqp_names.name("exchange"), amqp_names.name("queue")
    declare_amqp(amqp_url, exchange, queue)
    url = with_options(amqp_url, exchange=exchange, routing_key="{aggregate_type}.{event_type}")
    outbox = odb.outbox()
    ids = add_events(outbox, interleaved(aggregates=5, per_aggregate=4))
    stats = odb.run_until(outbox, url, published(odb, ids), batch=3, concurrency=2)
    assert stats.published == 20

    messages = take_amqp(amqp_url, queue)
    assert len(messages) == 20
    seen: dict[str, list[int]] = defaultdict(list)
    events = {event.id: event for event in outbox.events(limit=100)}
    for message in messages:
        body = json.loads(message.body)
        event = events[int(message.message_id)]
        assert body["id"] == event.id
        assert message.routing_key == "order.order%2Echanged"  # each field one word: the dot escaped
        assert message.headers["dibs-aggregate-id"] == event.aggregate_id
        assert body["payload"] == event.payload
        seen[event.aggregate_id].append(event.id)
    assert_in_order_once(dict(seen), expected_per_aggregate(odb))
