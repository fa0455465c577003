"""``dibs outbox``, run as a subprocess exactly as a user types it, on every backend, to real brokers."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.acceptance.cli import DIBS, ROOT, add_events
from tests.acceptance.cli import dibs as run
from tests.outbox.brokers import REDIS_URL


@pytest.fixture
def stream() -> Iterator[str]:
    """A Redis stream name of this test's own, deleted afterwards."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        client.close()
        pytest.fail(f"Redis is not reachable at {REDIS_URL}: {exc}; the outbox tests need it")
    name = f"dibs-cli-{uuid.uuid4().hex[:8]}"
    yield name
    client.delete(name)
    client.close()


@pytest.fixture
def refusing_webhook() -> Iterator[str]:
    """An HTTP server that answers every POST with 501 (python -m http.server serves GET only)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            break
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/events"
    server.terminate()
    server.wait(10)


def test_relay_inspect_requeue_and_purge(database: str, tmp_path: Path, stream: str, refusing_webhook: str) -> None:
    assert run(database, tmp_path, "init").returncode == 0
    ids = add_events(database, 6)

    status = run(database, tmp_path, "outbox", "status")
    assert status.returncode == 0, status.stderr
    assert "│       6 │" in status.stdout.replace("┃", "│")  # six pending

    # A broker that refuses every event: with no retries allowed, each is abandoned with its error kept.
    refused = run(database, tmp_path, "outbox", "relay", "-p", refusing_webhook, "--max-retries", "0", "--burst")
    assert refused.returncode == 0, refused.stderr
    assert "0 published" in refused.stdout
    # Under the default block policy only each aggregate's head was tried: three aggregates, three heads.
    assert "3 abandoned" in refused.stdout
    # One line for the batch, not one per event, and no line per HTTP request.
    assert "HTTP Request" not in refused.stderr
    assert refused.stderr.count("abandoned after") == 1, refused.stderr
    assert "3 events abandoned after 1 failed publish (max_retries=0 allows the first publish" in refused.stderr
    abandoned = run(database, tmp_path, "outbox", "list", "--status", "abandoned")
    assert abandoned.stdout.count("order.placed") == 3
    assert "501" in abandoned.stdout

    requeued = run(database, tmp_path, "outbox", "requeue", "--all")
    assert "requeued 3 events" in requeued.stdout
    relayed = run(
        database, tmp_path, "outbox", "relay", "-p", f"{REDIS_URL}?stream={stream}", "--batch", "2", "--burst"
    )
    assert relayed.returncode == 0, relayed.stderr
    assert "6 published" in relayed.stdout
    client = redis.Redis.from_url(REDIS_URL)
    try:
        published = [int(fields[b"id"]) for _, fields in client.xrange(stream)]
    finally:
        client.close()
    assert sorted(published) == ids
    for aggregate in range(3):
        mine = [event_id for event_id in published if (event_id - ids[0]) % 3 == aggregate]
        assert mine == sorted(mine)

    purged = run(database, tmp_path, "outbox", "purge", "--all", "--yes")
    assert "deleted 6 published events" in purged.stdout
    assert "no outbox events yet" in run(database, tmp_path, "outbox", "status").stdout


def test_relay_help_says_what_max_retries_counts() -> None:
    shown = subprocess.run(
        [DIBS, "outbox", "relay", "--help"], capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}
    )
    assert shown.returncode == 0, shown.stderr
    assert "Retries of a failed publish before the event is abandoned: at most N+1 publishes per event." in " ".join(
        shown.stdout.split()
    )


def test_bad_publisher_and_unreachable_broker_change_nothing(database: str, tmp_path: Path) -> None:
    assert run(database, tmp_path, "init").returncode == 0
    add_events(database, 2)
    for url, message in (
        ("kafka://127.0.0.1:9092", "Kafka is not supported yet"),
        ("ftp://example.org", "no publisher for ftp:// URLs"),
        ("redis://127.0.0.1:1/0", "cannot reach Redis at redis://127.0.0.1:1/0"),
    ):
        attempt = run(database, tmp_path, "outbox", "relay", "-p", url, "--burst")
        assert attempt.returncode == 1
        assert message in attempt.stderr
    pending = run(database, tmp_path, "outbox", "list", "--status", "pending")
    assert pending.stdout.count("order.placed") == 2
    assert "│ 0       │" in pending.stdout.replace("┃", "│")  # no retry counted


def test_sigterm_stops_a_running_relay(database: str, tmp_path: Path, stream: str) -> None:
    assert run(database, tmp_path, "init").returncode == 0
    relay = subprocess.Popen(
        [DIBS, "outbox", "relay", "-p", f"{REDIS_URL}?stream={stream}"],
        cwd=ROOT,
        env={"PATH": str(Path(sys.executable).parent), "DIBS_DATABASE_URL": database},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        add_events(database, 3)
        client = redis.Redis.from_url(REDIS_URL)
        try:
            deadline = time.monotonic() + 30
            while client.xlen(stream) < 3 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert client.xlen(stream) == 3
        finally:
            client.close()
        relay.send_signal(signal.SIGTERM)
        out, err = relay.communicate(timeout=30)
    finally:
        if relay.poll() is None:
            relay.kill()
            relay.communicate()
    assert relay.returncode == 0, err
    assert "relay stopped: 3 published" in out
