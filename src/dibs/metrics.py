"""Prometheus metrics of a worker, served on a port when asked (``pip install "dibs-sql[metrics]"``).

They are served on the loopback interface unless an address is given: the metrics name queues and tasks,
and a port open to every network should be a choice.

Counters: jobs claimed and finished by outcome (succeeded, retried, dead, cancelled, released).
Histograms: claim latency and job run time. Gauges, refreshed by the worker's upkeep: jobs per queue and
state, and the age of the oldest runnable job per queue.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any, Protocol

from dibs._checks import checked_integer
from dibs._errors import InvalidArgument

#: Where metrics are served unless asked otherwise: this machine only.
LOOPBACK = "127.0.0.1"


class QueueDepth(Protocol):
    """What the gauges read of one queue's status (a :class:`dibs.QueueStatus`)."""

    @property
    def queue(self) -> str: ...
    @property
    def counts(self) -> Mapping[str, int]: ...
    @property
    def oldest_ready_seconds(self) -> float | None: ...


def _prometheus() -> ModuleType:
    """The prometheus_client module; InvalidArgument saying which extra to install when it is missing."""
    try:
        import prometheus_client
    except ImportError as exc:
        raise InvalidArgument(
            "serving metrics (metrics_port, --metrics-port) needs the prometheus-client package, which the "
            'metrics extra installs: pip install "dibs-sql[metrics]"'
        ) from exc
    return prometheus_client


def checked_metrics_port(port: object) -> int:
    """A TCP port to serve metrics on, once the package that serves them is known to be installed."""
    checked = checked_integer(port, "metrics_port (a TCP port)", 0, 65_535)
    _prometheus()
    return checked


class Metrics:
    """The worker's instruments, in a registry of their own."""

    def __init__(self, registry: Any = None) -> None:
        prometheus = _prometheus()
        self.registry = registry if registry is not None else prometheus.CollectorRegistry()
        self._server: Any = None
        registry = self.registry
        self._claimed = prometheus.Counter("dibs_jobs_claimed", "Jobs claimed by this worker", registry=registry)
        self._finished = prometheus.Counter(
            "dibs_jobs_finished",
            "Jobs finished by this worker, by task and outcome",
            ["task", "outcome"],
            registry=registry,
        )
        self._claim_seconds = prometheus.Histogram(
            "dibs_claim_seconds",
            "Time one claim round trip took",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
            registry=registry,
        )
        self._run_seconds = prometheus.Histogram("dibs_job_run_seconds", "Time a job ran", ["task"], registry=registry)
        self._depth = prometheus.Gauge(
            "dibs_queue_jobs", "Jobs per queue and state", ["queue", "state"], registry=registry
        )
        self._oldest = prometheus.Gauge(
            "dibs_queue_oldest_ready_seconds",
            "How long the oldest runnable job has waited",
            ["queue"],
            registry=registry,
        )

    @classmethod
    def serve(cls, port: int, address: str = LOOPBACK) -> Metrics:
        """Instruments served over HTTP at ``address:port/metrics``."""
        metrics = cls()
        try:
            metrics._server, _thread = _prometheus().start_http_server(port, addr=address, registry=metrics.registry)
        except OSError as error:  # the port is taken, or the address is not this machine's
            raise InvalidArgument(
                f"cannot serve metrics on {address}:{port} ({error.strerror or error}); choose another "
                "metrics_port (--metrics-port), or stop what listens there"
            ) from error
        return metrics

    def close(self) -> None:
        """Stop serving (the port is free again)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def claimed(self, count: int, seconds: float) -> None:
        self._claimed.inc(count)
        self._claim_seconds.observe(seconds)

    def ran(self, task: str, seconds: float) -> None:
        self._run_seconds.labels(task).observe(seconds)

    def finished(self, task: str, outcome: str, count: int = 1) -> None:
        self._finished.labels(task, outcome).inc(count)

    def observe(self, statuses: Sequence[QueueDepth]) -> None:
        for status in statuses:
            for state, count in status.counts.items():
                self._depth.labels(status.queue, state).set(count)
            self._oldest.labels(status.queue).set(status.oldest_ready_seconds or 0.0)
