"""OpenTelemetry tracing of enqueues, claims, runs and relay publishes, when ``opentelemetry-api`` is installed.

Spans follow the messaging semantic conventions (``messaging.system`` is ``dibs``):

* ``enqueue QUEUE`` (producer, operation type ``send``) around an enqueue, in the caller's trace; each job
  keeps its context (W3C ``traceparent`` and ``tracestate``) in its ``headers`` column;
* ``claim QUEUE`` (client, ``receive``), one per claim that took jobs, linked to each job's enqueue;
* ``run QUEUE`` (consumer, ``process``), one per run of a job, a child of its enqueue: a job is enqueued once and
  run for that enqueue, so its runs (retries included) belong in the enqueuer's trace;
* ``publish TARGET`` (producer, ``send``) around a relay's publish of a batch: an outbox event keeps the context it was
  added in (``traceparent`` in its headers, which publishers send on); a batch of one event continues
  its trace, a larger one links to each.

:func:`tracing` decides once per process whether the API is there; :func:`active` also whether the application
set a tracer provider (a worker and a relay ask once, as they are made). Without either every caller holds
None and pays one comparison, no import, no span object.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from functools import cache
from importlib import metadata
from typing import Any

#: The instrumentation scope's name: dibs's spans come from this tracer.
SCOPE = "dibs"
SYSTEM = "dibs"


@cache
def tracing() -> Tracing | None:
    """The tracing of this process: None when ``opentelemetry-api`` is not installed (looked for once)."""
    try:
        from opentelemetry import propagate, trace
    except ImportError:
        return None
    return Tracing(trace, propagate)


def active() -> Tracing | None:
    """The tracing of this process if the API is installed and the application set a tracer provider, else None
    (spans no SDK records would cost a worker's every job for nothing)."""
    traced = tracing()
    return traced if traced is not None and traced.recording() else None


class Tracing:
    """dibs's spans, over the OpenTelemetry API's ``trace`` and ``propagate`` modules."""

    def __init__(self, trace: Any, propagate: Any) -> None:
        self._trace = trace
        self._propagate = propagate
        self._kind = trace.SpanKind
        # A proxy until the application sets its tracer provider, which it may do after this.
        self._tracer = trace.get_tracer(SCOPE, _version())

    def recording(self) -> bool:
        """Whether the application set a tracer provider (the API's own defaults record nothing)."""
        provider = self._trace.get_tracer_provider()
        return not isinstance(provider, (self._trace.ProxyTracerProvider, self._trace.NoOpTracerProvider))

    # -- carrying a context ------------------------------------------------------------------------

    def carried(self) -> dict[str, str]:
        """The current trace context as W3C headers (``traceparent``, ``tracestate``); empty outside a trace."""
        carrier: dict[str, str] = {}
        self._propagate.inject(carrier)
        return carrier

    def with_context(self, headers: Mapping[str, str] | None) -> Mapping[str, str] | None:
        """An outbox event's headers with the current trace context added, unless they carry one already."""
        if headers is not None and "traceparent" in headers:
            return headers
        carrier = self.carried()
        if not carrier:
            return headers
        return {**carrier, **headers} if headers else carrier

    def _context_of(self, headers: str | Mapping[str, str] | None) -> Any:
        """The context stored headers carry (JSON text or a mapping), or None for none."""
        if not headers:
            return None
        carrier = json.loads(headers) if isinstance(headers, str) else headers
        if not isinstance(carrier, dict) or "traceparent" not in carrier:
            return None
        return self._propagate.extract(carrier)

    def _links(self, many: Sequence[str | Mapping[str, str] | None]) -> list[Any]:
        links = []
        for headers in many:
            context = self._context_of(headers)
            if context is not None:
                span_context = self._trace.get_current_span(context).get_span_context()
                if span_context.is_valid:
                    links.append(self._trace.Link(span_context))
        return links

    # -- spans -------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def enqueue(self, queue: str, count: int) -> Iterator[str | None]:
        """A producer span around an enqueue of ``count`` jobs; yields the JSON headers each job keeps (None
        when no trace is recorded)."""
        attributes = _messaging("send", "enqueue", queue, count)
        with self._tracer.start_as_current_span(f"enqueue {queue}", kind=self._kind.PRODUCER, attributes=attributes):
            carrier = self.carried()
            yield json.dumps(carrier, separators=(",", ":")) if carrier else None

    def claimed(
        self, queues: Sequence[str], started_ns: int, headers: Sequence[str | None], error: BaseException | None
    ) -> None:
        """Record a claim that began at ``started_ns`` and took jobs with these headers (or failed)."""
        queue = queues[0] if len(queues) == 1 else "*"
        span = self._tracer.start_span(
            f"claim {queue}",
            kind=self._kind.CLIENT,
            attributes=_messaging("receive", "claim", queue if len(queues) == 1 else None, len(headers)),
            links=self._links(headers),
            start_time=started_ns,
        )
        if error is not None:
            self._failed(span, error)
        span.end()

    @contextlib.contextmanager
    def run(self, job_id: int, task: str, queue: str, attempt: int, headers: str | None) -> Iterator[Any]:
        """The consumer span of one run of a job, current inside; a child of the job's enqueue."""
        attributes = {**_messaging("process", "run", queue, None), "messaging.message.id": str(job_id)}
        attributes.update({"dibs.task": task, "dibs.attempt": attempt})
        with self._tracer.start_as_current_span(
            f"run {queue}",
            context=self._context_of(headers),
            kind=self._kind.CONSUMER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            yield span

    def ran(self, span: Any, error: BaseException | None) -> None:
        """Mark a run's span with what the run raised, if anything."""
        if error is not None:
            self._failed(span, error)

    @contextlib.contextmanager
    def publish(self, target: str, events: Sequence[Any]) -> Iterator[Any]:
        """The producer span of a relay's publish of ``events`` (OutboxEvents) to ``target``."""
        attributes = _messaging("send", "publish", target, len(events))
        if len(events) == 1:
            attributes["messaging.message.id"] = str(events[0].id)
        every = [event.headers for event in events]
        parent = self._context_of(every[0]) if len(events) == 1 else None
        with self._tracer.start_as_current_span(
            f"publish {target}",
            context=parent,
            kind=self._kind.PRODUCER,
            attributes=attributes,
            links=[] if parent is not None else self._links(every),
        ) as span:
            yield span

    def published(self, span: Any, outcomes: Sequence[BaseException | None]) -> None:
        """Mark a publish's span with the events that failed, if any."""
        failed = [outcome for outcome in outcomes if outcome is not None]
        if failed:
            for error in failed:
                span.record_exception(error)
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, f"{len(failed)} events not published"))

    def _failed(self, span: Any, error: BaseException) -> None:
        span.record_exception(error)
        span.set_attribute("error.type", type(error).__qualname__)
        span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, str(error)))


def _messaging(kind: str, operation: str, destination: str | None, count: int | None) -> dict[str, Any]:
    """The messaging attributes of a span: its operation type (send, receive, process) and dibs's name for it."""
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": kind,
        "messaging.operation.name": operation,
    }
    if destination is not None:
        attributes["messaging.destination.name"] = destination
    if count is not None and count != 1:
        attributes["messaging.batch.message_count"] = count
    return attributes


def _version() -> str | None:
    """dibs's version, as the instrumentation scope's (None when it runs from a source tree not installed)."""
    try:
        return metadata.version("dibs-sql")
    except metadata.PackageNotFoundError:
        return None
