"""The brokers the outbox tests publish to, and what the tests need around them.

Broker URLs come from the environment (the defaults are the services on loopback). Every test names its
streams, subjects, queues and exchanges with a fresh uuid and deletes them at the end. Also here: events
made directly, a real HTTP server that records what it is sent, and a TCP proxy that can cut a connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from dibs.outbox.events import OutboxEvent
from dibs.outbox.publishers import publisher_for

REDIS_URL = os.environ.get("DIBS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
NATS_URL = os.environ.get("DIBS_TEST_NATS_URL", "nats://127.0.0.1:4222")
AMQP_URL = os.environ.get("DIBS_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
#: A port nothing listens on: connecting is refused at once.
CLOSED_PORT = 1


def unique(prefix: str = "dibs-test-") -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"


def make_event(
    id: int,
    *,
    aggregate_type: str = "order",
    aggregate_id: str | None = None,
    event_type: str = "created",
    payload: Any = None,
    headers: dict[str, str] | None = None,
    target: str = "default",
) -> OutboxEvent:
    """An event as the relay would hand it to a publisher."""
    return OutboxEvent(
        id=id,
        target=target,
        aggregate_type=aggregate_type,
        aggregate_id=aggregate_id if aggregate_id is not None else f"{aggregate_type}-{id}",
        event_type=event_type,
        payload_json=json.dumps({"n": id, "text": "café ✓"} if payload is None else payload),
        headers={"trace-id": f"trace-{id}"} if headers is None else headers,
        created_at=datetime.now(timezone.utc),
    )


def batch() -> list[OutboxEvent]:
    """Three events of three aggregates (two aggregate types), with payloads and headers of their own."""
    return [
        make_event(101, aggregate_type="order", event_type="order.created"),
        make_event(102, aggregate_type="user", event_type="user.renamed", payload={"name": "Zoë", "tags": [1, 2]}),
        make_event(103, aggregate_type="order", event_type="order.paid", headers={"tenant": "t1", "trace-id": "x"}),
    ]


def with_options(url: str, **options: str) -> str:
    """The URL with query options added (values as written: templates keep their braces)."""
    query = "&".join(f"{name}={value}" for name, value in options.items())
    return f"{url}{'&' if '?' in url else '?'}{query}"


# -- reaching the brokers, and cleaning up after a test ------------------------------------------------


async def _quiet(error: Exception) -> None:
    pass


async def check_redis(url: str) -> None:
    """Raises unless Redis answers PING."""
    import redis.asyncio as redis

    client = redis.Redis.from_url(url, socket_connect_timeout=3)
    try:
        await client.ping()
    finally:
        await client.aclose()


async def nats_client(url: str) -> Any:
    """A connection to NATS (the caller closes it); raises at once when NATS is not there."""
    import nats

    return await nats.connect(
        url,
        connect_timeout=3,
        allow_reconnect=False,
        max_reconnect_attempts=1,
        reconnect_time_wait=0.1,
        error_cb=_quiet,
    )


async def check_nats(url: str) -> None:
    """Raises unless NATS answers, with JetStream enabled."""
    client = await nats_client(url)
    try:
        await client.jetstream().account_info()
    finally:
        await client.close()


async def check_amqp(url: str) -> None:
    """Raises unless RabbitMQ accepts a connection."""
    import aio_pika

    connection = await aio_pika.connect(url, timeout=3)
    await connection.close()


@dataclass
class Names:
    """The names one test made on a broker, all under one fresh tag, to delete at the end."""

    tag: str = field(default_factory=unique)
    made: list[tuple[str, str]] = field(default_factory=list)  # (kind, name)

    def name(self, kind: str, suffix: str = "") -> str:
        """A name of this test's (NATS streams may not hold dots or dashes: use this for them too)."""
        name = self.tag + suffix
        if kind == "stream":
            name = name.replace("-", "_").upper()
        if (kind, name) not in self.made:
            self.made.append((kind, name))
        return name


async def delete_redis_keys(url: str, prefix: str) -> None:
    import redis.asyncio as redis

    client = redis.Redis.from_url(url)
    try:
        keys = [key async for key in client.scan_iter(match=prefix + "*")]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


async def delete_nats_streams(url: str, names: Names) -> None:
    import nats.js.errors

    client = await nats_client(url)
    try:
        js = client.jetstream()
        for kind, name in names.made:
            if kind == "stream":
                with contextlib.suppress(nats.js.errors.NotFoundError):
                    await js.delete_stream(name)
    finally:
        await client.close()


async def delete_amqp_names(url: str, names: Names) -> None:
    """Deletes the test's queues and exchanges (deleting one that is not there is no error)."""
    import aio_pika

    connection = await aio_pika.connect(url, timeout=5)
    try:
        channel = await connection.channel()
        for kind, name in names.made:
            if kind == "queue":
                await channel.queue_delete(name)
            elif kind == "exchange":
                await channel.exchange_delete(name)
    finally:
        await connection.close()


# -- a real webhook endpoint ----------------------------------------------------------------------------


@dataclass
class Request:
    """One POST the webhook server was sent."""

    path: str
    headers: dict[str, str]  # names in lower case
    body: Any  # the JSON body, decoded


@dataclass
class WebhookServer:
    """An HTTP server on loopback that records each request and answers as the test says.

    ``respond`` decides the status from the decoded JSON body; 0 closes the connection without an answer.
    It runs on the server's thread, so it may sleep to make the answer late.
    """

    url: str
    requests: list[Request] = field(default_factory=list)
    respond: Callable[[Any], int] = lambda body: 200
    in_flight: int = 0
    most_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reject(self, *event_ids: int, status: int = 500) -> None:
        """Answer ``status`` for these events, 200 for the others."""
        self.respond = lambda body: status if body["id"] in event_ids else 200

    def ids(self) -> list[int]:
        return sorted(request.body["id"] for request in self.requests)


def _handler(server: WebhookServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            with server.lock:
                server.requests.append(Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                server.in_flight += 1
                server.most_in_flight = max(server.most_in_flight, server.in_flight)
            try:
                status = server.respond(body)
            finally:
                with server.lock:
                    server.in_flight -= 1
            if status == 0:
                self.close_connection = True
                return
            answer = b'{"error": "rejected by the test"}' if status >= 300 else b"{}"
            self.send_response(status)
            if 300 <= status < 400:
                self.send_header("Location", "/elsewhere")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() waits for requests still being answered

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up (a timeout test) is expected


def start_webhook_server() -> tuple[WebhookServer, Callable[[], None]]:
    """A WebhookServer on a free port of 127.0.0.1, and the function that stops it."""
    recorder = WebhookServer(url="")
    httpd = _Server(("127.0.0.1", 0), _handler(recorder))
    recorder.url = f"http://127.0.0.1:{httpd.server_address[1]}/hook"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()

    def stop() -> None:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)

    return recorder, stop


# -- a TCP proxy that can drop its connections ----------------------------------------------------------


class Proxy:
    """Forwards a loopback port to a broker; ``cut()`` drops every connection and stops listening,
    ``resume()`` listens again on the same port."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._listener: socket.socket | None = None
        self._accepting: threading.Thread | None = None
        self.resume()

    def resume(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen()
        listener.settimeout(0.05)  # so that the accepting thread sees cut() soon
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._accepting = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        self._accepting.start()

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # cut()
            client.settimeout(None)
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets += [client, server]
            self._spawn(self._pump, client, server)
            self._spawn(self._pump, server, client)

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Refuse new connections and drop the open ones (as a broker that went away)."""
        listener, self._listener = self._listener, None
        if self._accepting is not None:
            self._accepting.join(5)  # it stops within one accept timeout
        if listener is not None:
            listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        deadline = time.monotonic() + 5
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._threads = [thread for thread in self._threads if thread.is_alive()]

    def close(self) -> None:
        self.cut()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def publish(url: str, events: Sequence[OutboxEvent], *, connect: bool = True) -> list[BaseException | None]:
    """Make the publisher, (connect,) publish one batch and close."""
    publisher = publisher_for(url)
    try:
        if connect:
            await publisher.connect()
        return await publisher.publish(events)
    finally:
        await publisher.close()


async def read_stream(url: str, key: str) -> list[Any]:
    """The fields of every entry of the stream, in order."""
    import redis.asyncio as redis

    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return [fields for _, fields in await client.xrange(key) or []]
    finally:
        await client.aclose()


async def stream_messages(url: str, stream: str) -> tuple[Any, list[Any]]:
    """The stream's info and every message in it, in order."""
    client = await nats_client(url)
    try:
        js = client.jetstream()
        info = await js.stream_info(stream)
        messages = [await js.get_msg(stream, seq) for seq in range(info.state.first_seq, info.state.last_seq + 1)]
        return info, messages
    finally:
        await client.close()


async def declare(url: str, exchange: str, queue: str, binding: str = "#", kind: str = "topic") -> None:
    """A durable exchange with the queue bound to it (or only the queue, when exchange is "")."""
    import aio_pika

    connection = await aio_pika.connect(url, timeout=5)
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, durable=True)
        if exchange:
            await channel.declare_exchange(exchange, aio_pika.ExchangeType(kind), durable=True)
            await declared.bind(exchange, binding)
    finally:
        await connection.close()


async def take_all(url: str, queue: str) -> list[Any]:
    """Every message waiting in the queue, in order (acknowledged)."""
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
