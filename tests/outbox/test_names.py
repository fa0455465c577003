"""The names publishers make from an event's fields (NATS subjects, RabbitMQ routing keys, Redis stream keys):
each field is one escaped token, so a value never makes a wildcard, an invalid name or another level, and two
values never share a name. Against the real brokers."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import dibs
from dibs.outbox.publishers import publisher_for
from tests.outbox.brokers import (
    CLOSED_PORT,
    Names,
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

#: Aggregate types a subject or routing key could choke on, and a value that looks like one of them escaped.
AWKWARD = ["order line", "a.*", "a.>", "a.b", "a", "a b.c*d>e#f", "a%2Eb", "café", "*", ">", "#"]


def escaped(value: str) -> str:
    """The documented rule: letters, digits, ``_`` and ``-`` as they are, any other character ``%XX`` per UTF-8 byte."""
    return "".join(
        char if char.isascii() and (char.isalnum() or char in "_-") else "".join(f"%{b:02X}" for b in char.encode())
        for char in value
    )


def awkward_events() -> list[Any]:
    return [make_event(300 + n, aggregate_type=kind) for n, kind in enumerate(AWKWARD)]


def test_a_token_keeps_letters_digits_underscores_and_dashes_and_escapes_everything_else() -> None:
    from dibs.outbox.publishers.base import token

    assert token("Order_line-2") == "Order_line-2"
    assert token("a.*") == "a%2E%2A"
    assert token("a >") == "a%20%3E"
    assert token("café") == "caf%C3%A9"
    assert token("100%") == "100%25"
    assert token("a#b") == "a%23b"
    tokens = [token(value) for value in AWKWARD]
    assert tokens == [escaped(value) for value in AWKWARD]
    assert len(set(tokens)) == len(AWKWARD), "two values made one token"
    for made in tokens:
        assert all(char.isascii() and (char.isalnum() or char in "_-%") for char in made), made


def test_nats_publishes_each_awkward_value_on_a_literal_subject_of_its_own(nats_url: str, nats_names: Names) -> None:
    stream, prefix = nats_names.name("stream"), nats_names.tag
    url = with_options(nats_url, subject=prefix + ".{aggregate_type}", stream=stream)
    events = awkward_events()

    async def scenario() -> tuple[list[str], list[str], list[BaseException | None]]:
        client = await nats_client(nats_url)
        one_level: list[str] = []
        deeper: list[str] = []

        async def on_one_level(message: Any) -> None:
            one_level.append(message.subject)

        async def on_deeper(message: Any) -> None:
            deeper.append(message.subject)

        try:
            # Other consumers' wildcard subscriptions: a value may not reach the second one, nor miss the first.
            await client.subscribe(prefix + ".*", cb=on_one_level)
            await client.subscribe(prefix + ".*.>", cb=on_deeper)
            await client.flush()
            results = await publish(url, events)
            await client.flush()
            await asyncio.sleep(0.2)
            return one_level, deeper, results
        finally:
            await client.close()

    one_level, deeper, results = run(scenario())

    assert results == [None] * len(events)
    expected = [f"{prefix}.{escaped(kind)}" for kind in AWKWARD]
    _, messages = run(stream_messages(nats_url, stream))
    assert [message.subject for message in messages] == expected
    assert len(set(expected)) == len(expected)
    for subject in expected:
        assert not {" ", "*", ">"} & set(subject), subject
    assert sorted(one_level) == sorted(expected)
    assert deeper == []
    for message, event in zip(messages, events, strict=True):
        body = json.loads(message.data)
        assert body["aggregate_type"] == event.aggregate_type  # the value itself travels unescaped
        if event.aggregate_type.isascii():  # nats-py reads headers as Latin-1 (they go out as UTF-8)
            assert message.headers["dibs-aggregate-type"] == event.aggregate_type


def test_rabbitmq_routes_each_awkward_value_by_a_routing_key_of_one_word(amqp_url: str, amqp_names: Names) -> None:
    exchange = amqp_names.name("exchange")
    everything, one_word, a_and_more = (amqp_names.name("queue", suffix) for suffix in ("-all", "-one", "-a"))
    run(declare(amqp_url, exchange, everything, binding="#"))
    run(declare(amqp_url, exchange, one_word, binding="*"))
    run(declare(amqp_url, exchange, a_and_more, binding="a.#"))
    url = with_options(amqp_url, exchange=exchange, routing_key="{aggregate_type}")
    events = awkward_events()

    assert run(publish(url, events)) == [None] * len(events)

    expected = [escaped(kind) for kind in AWKWARD]
    assert [message.routing_key for message in run(take_all(amqp_url, everything))] == expected
    assert [message.routing_key for message in run(take_all(amqp_url, one_word))] == expected
    assert [message.routing_key for message in run(take_all(amqp_url, a_and_more))] == ["a"]


def test_rabbitmq_fields_of_a_routing_key_stay_words_of_their_own(amqp_url: str, amqp_names: Names) -> None:
    exchange, queue = amqp_names.name("exchange"), amqp_names.name("queue")
    run(declare(amqp_url, exchange, queue, binding="order.*"))
    url = with_options(amqp_url, exchange=exchange, routing_key="{aggregate_type}.{event_type}")
    events = [make_event(1, event_type="order.placed"), make_event(2, event_type="placed")]

    assert run(publish(url, events)) == [None, None]

    assert [message.routing_key for message in run(take_all(amqp_url, queue))] == [
        "order.order%2Eplaced",
        "order.placed",
    ]


def test_redis_gives_different_values_different_streams(redis_url: str, redis_prefix: str) -> None:
    url = with_options(redis_url, stream=redis_prefix + ".{aggregate_type}.{event_type}")
    events = [
        make_event(1, aggregate_type="a.b", event_type="c"),
        make_event(2, aggregate_type="a", event_type="b.c"),
        make_event(3, aggregate_type="a b*", event_type="c"),
    ]

    assert run(publish(url, events)) == [None, None, None]

    for event in events:
        key = f"{redis_prefix}.{escaped(event.aggregate_type)}.{escaped(event.event_type)}"
        entries = run(read_stream(redis_url, key))
        assert [(int(entry["id"]), entry["aggregate_type"]) for entry in entries] == [
            (event.id, event.aggregate_type)
        ], key


@pytest.mark.parametrize("field", ["aggregate_type", "event_type", "target"])
def test_a_webhook_url_with_an_event_field_is_refused(field: str) -> None:
    with pytest.raises(dibs.InvalidArgument, match="takes no event fields"):
        publisher_for(f"http://127.0.0.1:{CLOSED_PORT}/hooks/{{{field}}}")
