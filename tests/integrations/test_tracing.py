"""OpenTelemetry tracing, recorded by the SDK's in-memory exporter: one trace from a web request (a real
Starlette app) through the enqueue, the claim and the job's run on a worker to the outbox event the job adds
and a relay publishes, its ``traceparent`` sent on; failed runs and publishes marked as errors; and, with the
API absent or no tracer provider set, the same work done with no trace context written. On every backend."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import dibs
from dibs.outbox.publishers import Publisher
from dibs.schema import LATEST, MIGRATIONS, current_version
from tests.helpers.processes import ROOT
from tests.outbox.support import FAST_RELAY
from tests.queue.database import QueueDatabase
from tests.queue.support import job_rows

#: The trace of the request's caller, sent to the web app as a W3C traceparent header.
UPSTREAM_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
UPSTREAM = f"00-{UPSTREAM_TRACE}-00f067aa0ba902b7-01"

_exporter = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The spans finished during the test (the process's tracer provider can be set once: the first test does)."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
        trace.set_tracer_provider(provider)
    _exporter.clear()
    yield _exporter
    _exporter.clear()


def web_app(queue: dibs.App) -> Starlette:
    """A web app whose requests are server spans continuing their caller's trace, as an instrumented app's are."""
    tracer = trace.get_tracer("tests.web")

    async def place_order(request: Request) -> JSONResponse:
        order = await request.json()
        job = await queue.aenqueue("orders.ship", {"order_id": order["id"]})
        return JSONResponse({"job": job.id})

    app = Starlette(routes=[Route("/orders", place_order, methods=["POST"])])

    async def traced(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        carrier = {key.decode(): value.decode() for key, value in scope["headers"]}
        context = TraceContextTextMapPropagator().extract(carrier)
        with tracer.start_as_current_span(f"{scope['method']} {scope['path']}", context=context, kind=SpanKind.SERVER):
            await app(scope, receive, send)

    return traced  # type: ignore[return-value]


async def post(app: Any, path: str, body: Any, headers: dict[str, str]) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://shop") as client:
        return await client.post(path, json=body, headers=headers)


def one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    named = [span for span in spans if span.name == name]
    assert len(named) == 1, f"{name}: {[span.name for span in spans]}"
    return named[0]


def parent_of(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def test_one_trace_runs_from_a_web_request_through_the_job_to_the_published_event(
    qdb: QueueDatabase, spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dibs.outbox.events")
    queue = qdb.app()
    outbox = dibs.Outbox(qdb.new_engine())

    @queue.task(name="orders.ship")
    def ship(order_id: int) -> None:  # a sync task: it runs in a thread, in its run's span
        with outbox.engine.begin() as conn:
            outbox.add(conn, "order", order_id, "order.shipped", {"order_id": order_id})

    answer = asyncio.run(post(web_app(queue), "/orders", {"id": 7}, {"traceparent": UPSTREAM}))
    assert answer.status_code == 200
    (stored,) = job_rows(qdb.engine)
    assert json.loads(stored.headers)["traceparent"].split("-")[1] == UPSTREAM_TRACE
    assert qdb.drain(queue).succeeded == 1
    assert outbox.relay("log://", burst=True, **FAST_RELAY).run().published == 1

    finished = list(spans.get_finished_spans())
    request, enqueue = one(finished, "POST /orders"), one(finished, "enqueue default")
    claim, run, publish = one(finished, "claim default"), one(finished, "run default"), one(finished, "publish default")
    # The claim serves many jobs, of many traces: it starts its own and links to theirs.
    traced = [request, enqueue, run, publish]
    assert {format(span.context.trace_id, "032x") for span in traced} == {UPSTREAM_TRACE}
    assert claim.parent is None
    assert (enqueue.kind, claim.kind, run.kind, publish.kind) == (
        SpanKind.PRODUCER,
        SpanKind.CLIENT,
        SpanKind.CONSUMER,
        SpanKind.PRODUCER,
    )
    # The enqueue is in the request; the run is a child of the enqueue; the event, added in the run, is
    # published in a span that continues the run's.
    assert (parent_of(enqueue), parent_of(run), parent_of(publish)) == (
        request.context.span_id,
        enqueue.context.span_id,
        run.context.span_id,
    )
    assert [link.context.span_id for link in claim.links] == [enqueue.context.span_id]
    assert dict(run.attributes or {}) == {
        "messaging.system": "dibs",
        "messaging.operation.type": "process",
        "messaging.operation.name": "run",
        "messaging.destination.name": "default",
        "messaging.message.id": str(stored.id),
        "dibs.task": "orders.ship",
        "dibs.attempt": 1,
    }
    assert (enqueue.attributes or {})["messaging.operation.type"] == "send"
    assert (claim.attributes or {})["messaging.destination.name"] == "default"
    assert run.status.status_code is StatusCode.UNSET
    # The published message carries the trace on to its consumers.
    (published,) = [json.loads(record.getMessage()) for record in caplog.records if record.name == "dibs.outbox.events"]
    traceparent = published["headers"]["traceparent"]
    assert traceparent.split("-")[1:3] == [UPSTREAM_TRACE, format(run.context.span_id, "016x")]


def test_a_failed_run_is_an_error_on_its_span_and_each_attempt_is_a_span_of_the_trace(
    qdb: QueueDatabase, spans: InMemorySpanExporter
) -> None:
    queue = qdb.app()

    @queue.task(name="orders.charge", max_attempts=2, retry=dibs.Retry(base=0.01, factor=1.0, jitter=0.0))
    async def charge(order_id: int) -> None:  # an async task: it runs on the loop, in its run's span
        raise ConnectionError(f"the bank is away for order {order_id}")

    with trace.get_tracer("tests").start_as_current_span("checkout") as checkout:
        queue.enqueue("orders.charge", {"order_id": 3})
    assert qdb.drain(queue).dead == 1

    runs = [span for span in spans.get_finished_spans() if span.name == "run default"]
    assert [(span.attributes or {})["dibs.attempt"] for span in runs] == [1, 2]
    for span in runs:
        assert span.context.trace_id == checkout.get_span_context().trace_id
        assert span.status.status_code is StatusCode.ERROR
        assert (span.attributes or {})["error.type"] == "ConnectionError"
        (event,) = span.events
        assert event.name == "exception"
        assert (event.attributes or {})["exception.message"] == "the bank is away for order 3"


def test_a_bulk_enqueue_is_one_span_and_every_job_carries_its_context(
    qdb: QueueDatabase, spans: InMemorySpanExporter
) -> None:
    queue = qdb.app()

    @queue.task(name="orders.ship")
    def ship(order_id: int) -> None: ...

    with trace.get_tracer("tests").start_as_current_span("import orders"):
        queue.enqueue_many("orders.ship", [{"order_id": n} for n in range(3)])
    (enqueue,) = [span for span in spans.get_finished_spans() if span.name == "enqueue default"]
    assert (enqueue.attributes or {})["messaging.batch.message_count"] == 3
    carried = {tuple(json.loads(row.headers)["traceparent"].split("-")[1:3]) for row in job_rows(qdb.engine)}
    assert carried == {(f"{enqueue.context.trace_id:032x}", f"{enqueue.context.span_id:016x}")}


def test_an_event_added_in_a_trace_carries_it_and_a_failed_publish_is_an_error(
    qdb: QueueDatabase, spans: InMemorySpanExporter
) -> None:
    outbox = dibs.Outbox(qdb.new_engine(), max_retries=0)
    with trace.get_tracer("tests").start_as_current_span("place order") as placing:
        with outbox.engine.begin() as conn:
            event_id = outbox.add(conn, "order", 1, "order.placed", {}, headers={"tenant": "acme"})
        own = {"traceparent": UPSTREAM}
        with outbox.engine.begin() as conn:
            kept = outbox.add(conn, "order", 2, "order.placed", {}, headers=own)
    headers = outbox.get(event_id).headers
    assert headers["tenant"] == "acme"
    assert headers["traceparent"].split("-")[1] == format(placing.get_span_context().trace_id, "032x")
    assert outbox.get(kept).headers == {"traceparent": UPSTREAM}  # a context given by the caller is kept

    class Refusing(Publisher):
        description = "a broker that refuses everything"

        async def publish(self, events: Any) -> list[BaseException | None]:
            return [RuntimeError("refused")] * len(events)

    assert outbox.relay(Refusing(), burst=True, **FAST_RELAY).run().abandoned == 2
    sends = [span for span in spans.get_finished_spans() if span.name == "publish default"]
    assert sends
    assert all(span.status.status_code is StatusCode.ERROR for span in sends)
    linked = {link.context.trace_id for span in sends for link in span.links} | {
        span.parent.trace_id for span in sends if span.parent is not None
    }
    assert placing.get_span_context().trace_id in linked


#: A script run with the OpenTelemetry API made unimportable, or importable with no tracer provider set: jobs
#: and events go through, their rows without trace context, and tracing tells it is off.
WITHOUT = """
import importlib.abc, json, sys

if sys.argv[2] == "absent":
    class Absent(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                raise ImportError(f"{name} is blocked by the test")
            return None

    sys.meta_path.insert(0, Absent())

import sqlalchemy as sa
import dibs
from dibs.outbox.publishers import Publisher
from dibs.schema import jobs
from dibs.tracing import active, tracing

app = dibs.App(sys.argv[1])
outbox = dibs.Outbox(app.engine)


@app.task(name="orders.ship")
def ship(order_id: int) -> None:
    with outbox.engine.begin() as conn:
        outbox.add(conn, "order", order_id, "order.shipped", {})


app.enqueue("orders.ship", {"order_id": 1})
worked = app.worker(burst=True, handle_signals=False, poll=0.05).run()
relayed = outbox.relay("log://", burst=True, handle_signals=False, poll=0.05).run()
with app.engine.connect() as conn:
    headers = conn.execute(sa.select(jobs.c.headers)).scalar_one()
print(json.dumps({
    "tracing": tracing() is not None,
    "active": active() is not None,
    "loaded": "opentelemetry" in sys.modules,
    "succeeded": worked.succeeded,
    "published": relayed.published,
    "job_headers": headers,
    "event_headers": outbox.events(status="published")[0].headers,
}))
"""


@pytest.mark.parametrize("api", ["absent", "without a provider"])
def test_without_the_api_or_a_tracer_provider_work_goes_on_and_no_context_is_written(
    qdb: QueueDatabase, api: str
) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    url = qdb.url.render_as_string(hide_password=False)
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT, url, api], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen == {
        "tracing": api != "absent",
        "active": False,
        "loaded": api != "absent",
        "succeeded": 1,
        "published": 1,
        "job_headers": None,
        "event_headers": {},
    }


def test_a_database_made_before_trace_context_is_upgraded_and_its_jobs_run(
    empty_db: QueueDatabase, spans: InMemorySpanExporter
) -> None:
    """A jobs table of the step before trace context, without the headers column: its jobs stay, and run once
    it is upgraded."""
    engine = empty_db.engine
    step = next(step.version for step in MIGRATIONS if step.description.startswith("trace context"))
    dibs.migrate(engine, tuple(earlier for earlier in MIGRATIONS if earlier.version < step))
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE dibs_jobs DROP COLUMN headers"))
        conn.execute(
            sa.text(
                "INSERT INTO dibs_jobs (task, queue, args, priority, status, run_at, attempts, max_attempts, "
                "lease_token, cancel_requested, enqueued_at, has_children) VALUES ('work.echo', 'default', "
                "'{\"n\": 9}', 0, 'queued', :now, 0, 3, 0, false, :now, false)"
            ),
            {"now": datetime.now(timezone.utc).replace(tzinfo=None)},
        )
    assert "headers" not in {column["name"] for column in sa.inspect(engine).get_columns("dibs_jobs")}
    assert [applied.version for applied in dibs.migrate(engine)] == list(range(step, LATEST + 1))
    assert current_version(engine) == LATEST
    app = empty_db.app()

    @app.task(name="work.echo")
    def echo(n: int) -> int:
        return n

    empty_db.drain(app)
    (kept,) = job_rows(engine)
    assert (kept.status, kept.headers) == ("succeeded", None)
    (run,) = [span for span in spans.get_finished_spans() if span.name == "run default"]
    assert run.parent is None  # a job enqueued outside any trace starts its own
