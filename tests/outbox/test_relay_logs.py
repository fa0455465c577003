"""What a relay tells: how often a failing event is published before it is abandoned, as ``max_retries`` and
the log say; and a log that grows by batch, not by event or HTTP request. On every backend."""

from __future__ import annotations

import logging
from collections import Counter

import httpx
import pytest

import dibs
from tests.outbox.brokers import WebhookServer
from tests.outbox.support import OutboxDatabase, add_events, interleaved

QUICK = dibs.Retry(base=0.05, factor=1.0, jitter=0.0)


def relay_lines(caplog: pytest.LogCaptureFixture, level: int = logging.INFO) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.levelno >= level]


@pytest.mark.parametrize("max_retries", [0, 2])
def test_an_event_is_published_max_retries_plus_one_times_then_abandoned_saying_so(
    odb: OutboxDatabase, webhook_server: WebhookServer, caplog: pytest.LogCaptureFixture, max_retries: int
) -> None:
    caplog.set_level(logging.INFO, logger="dibs.relay")
    outbox = odb.outbox(max_retries=max_retries, retry=QUICK)
    event_id = outbox.add(outbox.engine, "order", "A", "order.placed", {})
    webhook_server.reject(event_id, status=503)

    stats = odb.run_until(outbox, webhook_server.url, lambda: outbox.get(event_id).status == "abandoned")

    tries = max_retries + 1
    assert webhook_server.ids() == [event_id] * tries
    assert (outbox.get(event_id).retry_count, stats.retried, stats.abandoned) == (tries, max_retries, 1)
    abandoned = [record.getMessage() for record in caplog.records if "abandoned after" in record.getMessage()]
    publishes = "publish" if tries == 1 else "publishes"
    assert abandoned == [
        f"1 event abandoned after {tries} failed {publishes} (max_retries={max_retries} allows the first publish "
        f"and {max_retries} retries): WebhookRejected: the webhook {webhook_server.url} answered 503 to event "
        f'{event_id}: {{"error": "rejected by the test"}}'
    ]
    retried = [record.getMessage() for record in caplog.records if "will be retried" in record.getMessage()]
    assert [message.split(":")[0] for message in retried] == [
        f"1 event failed to publish and will be retried (retry {n} of max_retries={max_retries})"
        for n in range(1, tries)
    ]


def test_a_batch_of_webhook_events_logs_a_few_lines_not_one_per_request(
    odb: OutboxDatabase, webhook_server: WebhookServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)  # the root logger at INFO, as `dibs outbox relay` sets it
    caplog.set_level(logging.DEBUG, logger="dibs.relay")
    outbox = odb.outbox(max_retries=0, retry=QUICK)
    ids = add_events(outbox, interleaved(aggregates=60, per_aggregate=1))
    webhook_server.reject(*ids[:20], status=500)

    # Four requests at once: the test server's listen backlog (5) would drop connections beyond it.
    stats = odb.drain(outbox, webhook_server.url + "?concurrency=4", batch=200)

    assert (stats.published, stats.abandoned) == (40, 20)
    assert len(webhook_server.ids()) == 60
    by_logger = Counter(record.name for record in relay_lines(caplog))
    assert "httpx" not in by_logger, [r.getMessage() for r in caplog.records if r.name == "httpx"][:3]
    # Started, stopped, and one line for the 20 abandoned events: however many events the batch held.
    assert by_logger == {"dibs.relay": 3}, [record.getMessage() for record in relay_lines(caplog)]
    (abandoned,) = [record for record in caplog.records if "abandoned after" in record.getMessage()]
    assert abandoned.levelno == logging.WARNING
    assert abandoned.getMessage().startswith("20 events abandoned after 1 failed publish")
    assert "(and 19 other errors)" in abandoned.getMessage()
    batches = [record.getMessage() for record in caplog.records if record.levelno == logging.DEBUG]
    assert [message.split(" in ")[0] for message in batches if message.startswith("published")] == [
        f"published 40 of 60 events to {webhook_server.url}"
    ]


def test_the_applications_own_httpx_requests_still_log(
    odb: OutboxDatabase, webhook_server: WebhookServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    outbox = odb.outbox()
    add_events(outbox, interleaved(aggregates=5, per_aggregate=1))
    assert odb.drain(outbox, webhook_server.url).published == 5
    httpx.post(webhook_server.url, json={"id": 0, "aggregate_id": "mine"})
    assert [record.name for record in caplog.records if "HTTP Request" in record.getMessage()] == ["httpx"]


def test_an_httpx_logger_set_to_info_shows_the_relays_requests(
    odb: OutboxDatabase, webhook_server: WebhookServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="httpx")  # asked for by name: the relay's requests show
    outbox = odb.outbox()
    add_events(outbox, interleaved(aggregates=5, per_aggregate=1))
    assert odb.drain(outbox, webhook_server.url).published == 5
    assert len([record for record in caplog.records if "HTTP Request" in record.getMessage()]) == 5
