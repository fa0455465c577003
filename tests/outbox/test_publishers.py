"""Each publisher against its real broker: what arrives, what fails per event, and a broker that is gone."""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import pytest

import dibs
from dibs.outbox.events import OutboxEvent
from dibs.outbox.publishers import BrokerUnavailable, Publisher, envelope, publisher_for
from tests.outbox.brokers import (
    CLOSED_PORT,
    Names,
    Proxy,
    WebhookServer,
    batch,
    declare,
    make_event,
    nats_client,
    publish,
    read_stream,
    run,
    stream_messages,
    take_all,
    with_options,
)

PASSWORD = "s3cret-pw"
#: How long a publisher may take to tell that its broker is not there.
QUICKLY = 5.0


@contextmanager
def within(seconds: float) -> Iterator[None]:
    started = time.monotonic()
    yield
    elapsed = time.monotonic() - started
    assert elapsed < seconds, f"took {elapsed:.1f}s, more than {seconds}s"


def assert_unavailable(url: str, *, connect: bool) -> str:
    """Publishing to url raises BrokerUnavailable quickly, naming where without the password; the message."""
    assert PASSWORD in url
    with within(QUICKLY), pytest.raises(BrokerUnavailable) as raised:
        run(publish(url, batch(), connect=connect))
    message = str(raised.value)
    assert PASSWORD not in message
    assert f"127.0.0.1:{CLOSED_PORT}" in message
    return message


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    return parts.hostname, parts.port


def through(url: str, proxy: Proxy) -> str:
    """The broker URL with its host and port replaced by the proxy's."""
    parts = urlsplit(url)
    user = parts.netloc.rpartition("@")[0]
    return parts._replace(netloc=(user + "@" if user else "") + f"127.0.0.1:{proxy.port}").geturl()


def assert_envelope(body: Any, event: OutboxEvent) -> None:
    """A decoded envelope says what the event says."""
    assert body == {
        "id": event.id,
        "target": event.target,
        "aggregate_type": event.aggregate_type,
        "aggregate_id": event.aggregate_id,
        "event_type": event.event_type,
        "payload": json.loads(event.payload_json),
        "headers": event.headers,
        "created_at": event.created_at.isoformat(),
    }


async def eventually_published(publisher: Publisher, events: Sequence[OutboxEvent], seconds: float) -> int:
    """Publishes until the broker takes the batch; how many BrokerUnavailable came first."""
    deadline = time.monotonic() + seconds
    unavailable = 0
    while True:
        try:
            results = await publisher.publish(events)
        except BrokerUnavailable:
            unavailable += 1
            assert time.monotonic() < deadline, "the publisher did not recover"
            await asyncio.sleep(0.2)
            continue
        assert results == [None] * len(events)
        return unavailable


# -- Redis Streams -------------------------------------------------------------------------------------------


def test_redis_adds_each_event_to_its_stream(redis_url: str, redis_prefix: str) -> None:
    events = batch()
    url = with_options(redis_url, stream=redis_prefix + ".{aggregate_type}")

    assert run(publish(url, events)) == [None, None, None]

    orders = run(read_stream(redis_url, redis_prefix + ".order"))
    users = run(read_stream(redis_url, redis_prefix + ".user"))
    assert [int(entry["id"]) for entry in orders] == [101, 103]  # in the order given
    assert [int(entry["id"]) for entry in users] == [102]
    for entry, event in [(orders[0], events[0]), (users[0], events[1]), (orders[1], events[2])]:
        assert entry == {
            "id": str(event.id),
            "aggregate_type": event.aggregate_type,
            "aggregate_id": event.aggregate_id,
            "event_type": event.event_type,
            "payload": event.payload_json,
            "headers": json.dumps(event.headers),
            "created_at": event.created_at.isoformat(),
        }


def test_redis_failure_of_one_event_is_that_events_error(redis_url: str, redis_prefix: str) -> None:
    import redis.asyncio as redis

    async def occupy() -> None:  # a string where the user stream would be: XADD to it fails
        client = redis.Redis.from_url(redis_url)
        await client.set(redis_prefix + ".user", "not a stream")
        await client.aclose()

    run(occupy())
    url = with_options(redis_url, stream=redis_prefix + ".{aggregate_type}")

    results = run(publish(url, batch()))

    assert results[0] is None
    assert results[2] is None
    assert isinstance(results[1], redis.ResponseError)
    assert "WRONGTYPE" in str(results[1])
    assert len(run(read_stream(redis_url, redis_prefix + ".order"))) == 2


@pytest.mark.parametrize("connect", [True, False], ids=["connect", "publish"])
def test_redis_down_is_broker_unavailable(connect: bool) -> None:
    assert_unavailable(f"redis://:{PASSWORD}@127.0.0.1:{CLOSED_PORT}/0", connect=connect)


# -- NATS JetStream ------------------------------------------------------------------------------------------


def test_nats_makes_the_stream_and_publishes_each_event(nats_url: str, nats_names: Names) -> None:
    events = batch()
    stream, prefix = nats_names.name("stream"), nats_names.tag
    url = with_options(nats_url, subject=prefix + ".events.{aggregate_type}", stream=stream)

    assert run(publish(url, events)) == [None, None, None]

    info, messages = run(stream_messages(nats_url, stream))
    assert info.config.subjects == [prefix + ".events.>"]
    assert [message.subject for message in messages] == [f"{prefix}.events.{event.aggregate_type}" for event in events]
    for message, event in zip(messages, events, strict=True):
        assert_envelope(json.loads(message.data), event)
        assert message.headers == {
            **event.headers,
            "Nats-Msg-Id": str(event.id),
            "dibs-event-id": str(event.id),
            "dibs-aggregate-type": event.aggregate_type,
            "dibs-aggregate-id": event.aggregate_id,
            "dibs-event-type": event.event_type,
        }


def test_nats_fixed_subject_makes_a_stream_of_that_subject(nats_url: str, nats_names: Names) -> None:
    stream, subject = nats_names.name("stream"), nats_names.tag + ".all"

    assert run(publish(with_options(nats_url, subject=subject, stream=stream), batch())) == [None, None, None]

    info, messages = run(stream_messages(nats_url, stream))
    assert info.config.subjects == [subject]
    assert len(messages) == 3


def test_nats_drops_a_repeated_event_id_and_confirms_it(nats_url: str, nats_names: Names) -> None:
    """A republished event (its ack was lost, say) is stored once: Nats-Msg-Id is the event id."""
    stream = nats_names.name("stream")
    url = with_options(nats_url, subject=nats_names.tag + ".{aggregate_type}", stream=stream)
    events = batch()

    assert run(publish(url, events)) == [None, None, None]
    assert run(publish(url, events[:1])) == [None]

    _, messages = run(stream_messages(nats_url, stream))
    assert [json.loads(message.data)["id"] for message in messages] == [101, 102, 103]


def test_nats_leaves_an_existing_stream_alone_and_fails_events_no_stream_takes(
    nats_url: str, nats_names: Names
) -> None:
    stream, prefix = nats_names.name("stream"), nats_names.tag

    async def make_stream() -> None:
        client = await nats_client(nats_url)
        await client.jetstream().add_stream(name=stream, subjects=[prefix + ".order"])
        await client.close()

    run(make_stream())
    url = with_options(nats_url, subject=prefix + ".{aggregate_type}", stream=stream)

    results = run(publish(url, batch()))

    assert results[0] is None
    assert results[2] is None
    assert isinstance(results[1], Exception)
    assert not isinstance(results[1], BrokerUnavailable)
    assert f"{prefix}.user" in str(results[1])
    info, messages = run(stream_messages(nats_url, stream))
    assert info.config.subjects == [prefix + ".order"]  # not widened
    assert [json.loads(message.data)["id"] for message in messages] == [101, 103]


def test_nats_without_a_stream_fails_each_event_not_the_broker(nats_url: str, nats_names: Names) -> None:
    url = with_options(nats_url, subject=nats_names.tag + ".{aggregate_type}")

    with within(QUICKLY):  # "no responders" comes back at once, not after the ack timeout
        results = run(publish(url, batch()))

    assert len(results) == 3
    for result in results:
        assert isinstance(result, Exception)
        assert not isinstance(result, BrokerUnavailable)
        assert "no JetStream stream" in str(result)


@pytest.mark.parametrize("connect", [True, False], ids=["connect", "publish"])
def test_nats_down_is_broker_unavailable(connect: bool) -> None:
    message = assert_unavailable(f"nats://dibs:{PASSWORD}@127.0.0.1:{CLOSED_PORT}", connect=connect)
    assert "Connection refused" in message or "Connect call failed" in message


def test_nats_token_is_not_shown() -> None:
    publisher = publisher_for(f"nats://{PASSWORD}@127.0.0.1:{CLOSED_PORT}")
    with pytest.raises(BrokerUnavailable) as raised:
        run(publisher.connect())
    assert PASSWORD not in str(raised.value)
    assert PASSWORD not in publisher.description


def test_nats_dropped_connection_is_broker_unavailable_then_recovers(
    nats_url: str, nats_names: Names, proxy: Callable[[str, int], Proxy]
) -> None:
    tunnel = proxy(*host_port(nats_url))
    stream = nats_names.name("stream")
    url = with_options(through(nats_url, tunnel), subject=nats_names.tag + ".x", stream=stream)

    async def scenario() -> None:
        async with publisher_for(url) as publisher:
            assert await publisher.publish(batch()[:1]) == [None]
            tunnel.cut()
            with within(QUICKLY), pytest.raises(BrokerUnavailable, match="NATS"):
                await publisher.publish(batch())
            tunnel.resume()
            await eventually_published(publisher, batch(), 10)

    run(scenario())
    _, messages = run(stream_messages(nats_url, stream))
    assert [json.loads(message.data)["id"] for message in messages] == [101, 102, 103]


# -- RabbitMQ --------------------------------------------------------------------------------------------------


def test_rabbitmq_publishes_persistent_messages_to_the_exchange(amqp_url: str, amqp_names: Names) -> None:
    exchange, queue = amqp_names.name("exchange"), amqp_names.name("queue")
    run(declare(amqp_url, exchange, queue, binding="#"))
    events = batch()
    url = with_options(amqp_url, exchange=exchange, routing_key="{aggregate_type}.{event_type}")

    assert run(publish(url, events)) == [None, None, None]

    messages = run(take_all(amqp_url, queue))
    assert sorted(message.message_id for message in messages) == ["101", "102", "103"]
    for message in sorted(messages, key=lambda message: int(message.message_id)):
        event = next(event for event in events if str(event.id) == message.message_id)
        assert_envelope(json.loads(message.body), event)
        # Each field is one word of the key: the event type's dot is escaped.
        assert message.routing_key == f"{event.aggregate_type}.{event.event_type.replace('.', '%2E')}"
        assert message.type == event.event_type
        assert message.content_type == "application/json"
        assert message.delivery_mode == 2  # persistent
        assert message.timestamp == event.created_at.replace(microsecond=0)
        assert message.headers == {
            **event.headers,
            "dibs-event-id": str(event.id),
            "dibs-aggregate-type": event.aggregate_type,
            "dibs-aggregate-id": event.aggregate_id,
        }


def test_rabbitmq_default_exchange_routes_to_the_queue_named(amqp_url: str, amqp_names: Names) -> None:
    queue = amqp_names.name("queue")
    run(declare(amqp_url, "", queue))

    assert run(publish(with_options(amqp_url, routing_key=queue), batch())) == [None, None, None]

    assert sorted(message.message_id for message in run(take_all(amqp_url, queue))) == ["101", "102", "103"]


def test_rabbitmq_unroutable_event_is_that_events_error(amqp_url: str, amqp_names: Names) -> None:
    """mandatory: a message no queue takes comes back, and counts as not sent."""
    import aio_pika.exceptions

    exchange, queue = amqp_names.name("exchange"), amqp_names.name("queue")
    run(declare(amqp_url, exchange, queue, binding="order"))
    url = with_options(amqp_url, exchange=exchange)

    results = run(publish(url, batch()))

    assert results[0] is None
    assert results[2] is None
    assert isinstance(results[1], aio_pika.exceptions.DeliveryError)
    assert "NO_ROUTE" in str(results[1])
    assert sorted(message.message_id for message in run(take_all(amqp_url, queue))) == ["101", "103"]


def test_rabbitmq_exchange_of_another_type_is_an_invalid_argument(amqp_url: str, amqp_names: Names) -> None:
    exchange, queue = amqp_names.name("exchange"), amqp_names.name("queue")
    run(declare(amqp_url, exchange, queue, kind="fanout"))
    publisher = publisher_for(with_options(amqp_url, exchange=exchange, exchange_type="topic"))

    with pytest.raises(dibs.InvalidArgument, match="exchange_type="):
        run(publisher.connect())
    run(publisher.close())


def test_rabbitmq_deleted_exchange_fails_the_batch_then_is_declared_again(amqp_url: str, amqp_names: Names) -> None:
    import aio_pika

    exchange, queue = amqp_names.name("exchange"), amqp_names.name("queue")
    run(declare(amqp_url, exchange, queue))
    publisher = publisher_for(with_options(amqp_url, exchange=exchange))

    async def delete_exchange() -> None:
        connection = await aio_pika.connect(amqp_url)
        await (await connection.channel()).exchange_delete(exchange)
        await connection.close()

    async def scenario() -> tuple[list[BaseException | None], list[BaseException | None]]:
        try:
            await publisher.connect()
            await delete_exchange()
            first = await publisher.publish(batch())  # the broker closes the channel: no such exchange
            await declare(amqp_url, exchange, queue)  # bound again (publish() redeclares it too)
            second = await publisher.publish(batch())
            return first, second
        finally:
            await publisher.close()

    first, second = run(scenario())

    assert all(isinstance(result, Exception) and not isinstance(result, BrokerUnavailable) for result in first)
    assert "NOT_FOUND" in str(first[0])
    assert second == [None, None, None]
    assert len(run(take_all(amqp_url, queue))) == 3


@pytest.mark.parametrize("connect", [True, False], ids=["connect", "publish"])
def test_rabbitmq_down_is_broker_unavailable(connect: bool) -> None:
    assert_unavailable(f"amqp://guest:{PASSWORD}@127.0.0.1:{CLOSED_PORT}/", connect=connect)


def test_rabbitmq_dropped_connection_is_broker_unavailable_then_recovers(
    amqp_url: str, amqp_names: Names, proxy: Callable[[str, int], Proxy]
) -> None:
    tunnel = proxy(*host_port(amqp_url))
    queue = amqp_names.name("queue")
    run(declare(amqp_url, "", queue))
    url = with_options(through(amqp_url, tunnel), routing_key=queue)

    async def scenario() -> None:
        async with publisher_for(url) as publisher:
            assert await publisher.publish(batch()[:1]) == [None]
            tunnel.cut()
            with within(QUICKLY), pytest.raises(BrokerUnavailable, match="RabbitMQ"):
                await publisher.publish(batch())
            tunnel.resume()
            await eventually_published(publisher, batch(), 10)

    run(scenario())
    assert sorted(message.message_id for message in run(take_all(amqp_url, queue))) == ["101", "101", "102", "103"]


# -- webhook ---------------------------------------------------------------------------------------------------


def test_webhook_posts_each_event(webhook_server: WebhookServer) -> None:
    events = batch()

    assert run(publish(webhook_server.url, events)) == [None, None, None]

    assert webhook_server.ids() == [101, 102, 103]
    for request in webhook_server.requests:
        event = next(event for event in events if event.id == request.body["id"])
        assert request.path == "/hook"
        assert_envelope(request.body, event)
        assert request.headers["content-type"] == "application/json"
        assert request.headers["dibs-event-id"] == request.headers["idempotency-key"] == str(event.id)
        assert request.headers["dibs-event-type"] == event.event_type
        assert request.headers["dibs-aggregate-type"] == event.aggregate_type
        assert request.headers["dibs-aggregate-id"] == event.aggregate_id
        for name, value in event.headers.items():
            assert request.headers[name.lower()] == value


def test_webhook_keeps_the_endpoints_query_and_takes_out_its_own(webhook_server: WebhookServer) -> None:
    url = webhook_server.url + "?token=a%26b%3D&timeout=5&concurrency=2&x=1"

    assert run(publish(url, batch()[:1])) == [None]

    assert [request.path for request in webhook_server.requests] == ["/hook?token=a%26b%3D&x=1"]
    assert publisher_for(url).description == webhook_server.url + "?..."  # logs show no token


def test_webhook_user_and_password_are_basic_auth(webhook_server: WebhookServer) -> None:
    url = webhook_server.url.replace("http://", f"http://dibs:{PASSWORD}@")

    assert run(publish(url, batch()[:1])) == [None]

    (request,) = webhook_server.requests
    assert request.headers["authorization"] == "Basic " + base64.b64encode(f"dibs:{PASSWORD}".encode()).decode()


def test_webhook_event_headers_do_not_replace_dibs_headers(webhook_server: WebhookServer) -> None:
    event = make_event(7, headers={"Idempotency-Key": "mine", "X-Tenant": "t9"})

    assert run(publish(webhook_server.url, [event])) == [None]

    (request,) = webhook_server.requests
    assert request.headers["idempotency-key"] == "7"
    assert request.headers["x-tenant"] == "t9"


@pytest.mark.parametrize("status", [500, 404, 302])
def test_webhook_non_2xx_answer_is_that_events_error(webhook_server: WebhookServer, status: int) -> None:
    webhook_server.reject(102, status=status)

    results = run(publish(webhook_server.url, batch()))

    assert results[0] is None
    assert results[2] is None
    error = results[1]
    assert isinstance(error, Exception)
    assert not isinstance(error, BrokerUnavailable)
    assert str(status) in str(error)
    assert "102" in str(error)
    assert "rejected by the test" in str(error)  # an excerpt of the answer
    assert webhook_server.ids() == [101, 102, 103]


def test_webhook_late_answer_is_that_events_error(webhook_server: WebhookServer) -> None:
    import httpx

    def respond(body: Any) -> int:
        if body["id"] == 102:
            time.sleep(1.5)
        return 200

    webhook_server.respond = respond

    with within(1.4):
        results = run(publish(webhook_server.url + "?timeout=0.3", batch()))

    assert results[0] is None
    assert results[2] is None
    assert isinstance(results[1], httpx.ReadTimeout)


def test_webhook_connection_closed_without_answer(webhook_server: WebhookServer) -> None:
    import httpx

    webhook_server.respond = lambda body: 0 if body["id"] == 102 else 200
    results = run(publish(webhook_server.url, batch()))
    assert results[0] is None
    assert results[2] is None
    assert isinstance(results[1], httpx.RemoteProtocolError)

    webhook_server.respond = lambda body: 0  # not one request got through
    with pytest.raises(BrokerUnavailable, match=r"127\.0\.0\.1"):
        run(publish(webhook_server.url, batch()))


def test_webhook_sends_at_most_concurrency_requests_at_once(webhook_server: WebhookServer) -> None:
    def respond(body: Any) -> int:
        time.sleep(0.2)
        return 200

    webhook_server.respond = respond
    events = [make_event(n, aggregate_id=f"a{n}") for n in range(1, 7)]

    assert run(publish(webhook_server.url + "?concurrency=2", events)) == [None] * 6

    assert webhook_server.most_in_flight == 2
    assert webhook_server.ids() == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("connect", [True, False], ids=["connect", "publish"])
def test_webhook_down_is_broker_unavailable(connect: bool) -> None:
    assert_unavailable(f"http://dibs:{PASSWORD}@127.0.0.1:{CLOSED_PORT}/hook", connect=connect)


# -- log and stdout ----------------------------------------------------------------------------------------------


def test_log_writes_each_event_to_the_logger(caplog: pytest.LogCaptureFixture) -> None:
    events = batch()
    caplog.set_level(logging.DEBUG, logger="dibs.test.events")

    assert run(publish("log://?level=warning&logger=dibs.test.events", events)) == [None, None, None]

    records = [record for record in caplog.records if record.name == "dibs.test.events"]
    assert [record.levelno for record in records] == [logging.WARNING] * 3
    for record, event in zip(records, events, strict=True):
        assert_envelope(json.loads(record.getMessage()), event)


def test_stdout_writes_one_json_line_per_event(capsys: pytest.CaptureFixture[str]) -> None:
    events = batch()

    assert run(publish("stdout://", events)) == [None, None, None]

    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    for line, event in zip(lines, events, strict=True):
        assert line == envelope(event)
        assert_envelope(json.loads(line), event)


# -- URLs -------------------------------------------------------------------------------------------------------

CLOSED = f"127.0.0.1:{CLOSED_PORT}"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        (f"redis://{CLOSED}/0?stream=dibs.{{nope}}", "{nope}"),
        (f"redis://{CLOSED}/0?maxlen=abc", "maxlen="),
        (f"redis://{CLOSED}/0?stream=a&stream=b", "stream= twice"),
        (f"kafka://{CLOSED}", "Kafka"),
        (f"mqtt://{CLOSED}", "supported schemes"),
        (CLOSED, "redis://localhost:6379/0"),
        (f"nats://{CLOSED}?subject=dibs.{{nope}}", "{nope}"),
        (f"nats://{CLOSED}?stream=has.dot", "stream="),
        (f"nats://{CLOSED}?stream=S&subject={{aggregate_type}}.x", "fixed token"),
        (f"nats://{CLOSED}?subjects=x", "subject="),
        (f"nats://{CLOSED}?timeout=-1", "timeout="),
        ("nats://127.0.0.1:port", "nats://host:4222"),
        (f"amqp://{CLOSED}/?routing_key={{nope}}", "{nope}"),
        (f"redis://{CLOSED}/0?stream={{aggregate_type", "is not a template"),
        (f"nats://{CLOSED}?subject=a.{{", "is not a template"),
        (f"amqp://{CLOSED}/?routing_key=}}x", "is not a template"),
        (f"amqp://{CLOSED}/?exchange=x&exchange_type=bogus", "topic"),
        (f"amqp://{CLOSED}/?exchange_type=topic", "exchange="),
        (f"amqp://{CLOSED}/?timeout=abc", "timeout="),
        (f"http://{CLOSED}/hook?timeout=abc", "timeout="),
        (f"http://{CLOSED}/hook?concurrency=0", "concurrency="),
        ("http:///hook", "http://host/path"),
        ("log://?level=loud", "level="),
        ("stdout://?x=1", "no options"),
    ],
)
def test_bad_url_is_an_invalid_argument_before_any_io(url: str, says: str) -> None:
    with pytest.raises(dibs.InvalidArgument) as raised:
        publisher_for(url)
    assert says in str(raised.value)


def test_a_password_in_the_query_is_not_shown() -> None:
    publisher = publisher_for(f"redis://{CLOSED}/0?stream=orders&password={PASSWORD}")
    assert PASSWORD not in publisher.description
    assert "password=***" in publisher.description
    with pytest.raises(BrokerUnavailable) as raised:
        run(publisher.connect())
    assert PASSWORD not in str(raised.value)
    run(publisher.close())


@pytest.mark.parametrize(
    "url",
    [
        f"redis://:{PASSWORD}@{CLOSED}/0",
        f"nats://dibs:{PASSWORD}@{CLOSED}?subject=dibs.{{event_type}}&stream=DIBS",
        f"tls://dibs:{PASSWORD}@{CLOSED}",
        f"amqp://guest:{PASSWORD}@{CLOSED}/vhost?exchange=dibs&exchange_type=direct&heartbeat=30",
        f"amqps://guest:{PASSWORD}@{CLOSED}/",
        f"https://dibs:{PASSWORD}@{CLOSED}/hook?timeout=2.5&concurrency=4",
    ],
)
def test_good_url_makes_a_publisher_without_io(url: str) -> None:
    with within(0.5):
        publisher = publisher_for(url)
    assert PASSWORD not in publisher.description
    assert CLOSED in publisher.description
    run(publisher.close())


# -- a relay runs several lanes on one publisher ----------------------------------------------------------------


def test_concurrent_batches_share_one_connection(
    nats_url: str, nats_names: Names, amqp_url: str, amqp_names: Names, webhook_server: WebhookServer
) -> None:
    queue = amqp_names.name("queue")
    run(declare(amqp_url, "", queue))
    urls = [
        with_options(nats_url, subject=nats_names.tag + ".{aggregate_type}", stream=nats_names.name("stream")),
        with_options(amqp_url, routing_key=queue),
        webhook_server.url,
    ]
    lanes = [[make_event(n, aggregate_id=f"a{n}"), make_event(n + 1, aggregate_id=f"a{n + 1}")] for n in (1, 3, 5)]

    async def scenario(url: str) -> list[list[BaseException | None]]:
        async with publisher_for(url) as publisher:
            await publisher.close()  # as after a drop: the lanes' next batches all connect anew
            return await asyncio.gather(*(publisher.publish(lane) for lane in lanes))

    for url in urls:
        assert run(scenario(url)) == [[None, None]] * 3, url
        gc.collect()  # a connection made twice and dropped unclosed would warn here

    _, messages = run(stream_messages(nats_url, nats_names.name("stream")))
    assert sorted(json.loads(message.data)["id"] for message in messages) == [1, 2, 3, 4, 5, 6]
    assert sorted(int(message.message_id) for message in run(take_all(amqp_url, queue))) == [1, 2, 3, 4, 5, 6]
    assert webhook_server.ids() == [1, 2, 3, 4, 5, 6]
