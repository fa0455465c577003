"""The publisher tests' fixtures, as a pytest plugin (registered by the root conftest): each broker's URL once
it answered, fresh names on it that are deleted after the test, a webhook server and TCP proxies."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

from tests.helpers.targets import IN_CI
from tests.outbox.brokers import (
    AMQP_URL,
    NATS_URL,
    REDIS_URL,
    Names,
    Proxy,
    WebhookServer,
    check_amqp,
    check_nats,
    check_redis,
    delete_amqp_names,
    delete_nats_streams,
    delete_redis_keys,
    start_webhook_server,
    unique,
)


def _reachable(name: str, url: str, env: str, check: Callable[[str], Coroutine[Any, Any, None]]) -> str:
    """The URL, once the broker answered; else a skip (a failure in CI) saying what to start or set."""
    from dibs.outbox.publishers.base import redacted

    try:
        asyncio.run(asyncio.wait_for(check(url), 10))
    except Exception as exc:
        first_line = (str(exc) or repr(exc)).splitlines()[0]
        message = (
            f"{name} is not reachable at {redacted(url)} ({exc.__class__.__name__}: {first_line}). "
            f"Start it, or point {env} at one."
        )
        if IN_CI:
            pytest.fail(f"CI needs every broker: {message}", pytrace=False)
        pytest.skip(message)
    return url


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The Redis server's URL (DIBS_TEST_REDIS_URL), once it answered."""
    return _reachable("Redis", REDIS_URL, "DIBS_TEST_REDIS_URL", check_redis)


@pytest.fixture(scope="session")
def nats_url() -> str:
    """The NATS server's URL (DIBS_TEST_NATS_URL), once it answered with JetStream enabled."""
    return _reachable("NATS with JetStream", NATS_URL, "DIBS_TEST_NATS_URL", check_nats)


@pytest.fixture(scope="session")
def amqp_url() -> str:
    """The RabbitMQ server's URL (DIBS_TEST_AMQP_URL), once it answered."""
    return _reachable("RabbitMQ", AMQP_URL, "DIBS_TEST_AMQP_URL", check_amqp)


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A fresh key prefix; every key under it is deleted after the test."""
    prefix = unique()
    yield prefix
    asyncio.run(delete_redis_keys(redis_url, prefix))


@pytest.fixture
def nats_names(nats_url: str) -> Iterator[Names]:
    """Fresh names for the test's subjects and streams; the streams it named are deleted after it."""
    names = Names()
    yield names
    asyncio.run(delete_nats_streams(nats_url, names))


@pytest.fixture
def amqp_names(amqp_url: str) -> Iterator[Names]:
    """Fresh names for the test's exchanges and queues; those it named are deleted after it."""
    names = Names()
    yield names
    asyncio.run(delete_amqp_names(amqp_url, names))


@pytest.fixture
def webhook_server() -> Iterator[WebhookServer]:
    """A real HTTP server on 127.0.0.1 that records each request and answers as the test programs it."""
    server, stop = start_webhook_server()
    yield server
    stop()


@pytest.fixture
def proxy() -> Iterator[Callable[[str, int], Proxy]]:
    """Makes TCP proxies to a broker (host, port), to cut its connections; all are closed after the test."""
    made: list[Proxy] = []

    def make(host: str, port: int) -> Proxy:
        made.append(Proxy(host, port))
        return made[-1]

    yield make
    for each in made:
        each.close()
