"""A worker's settings, checked once: what :class:`~dibs.queue.worker.Worker` takes, as one frozen value."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

from dibs._checks import checked_count, checked_name, checked_owner, checked_seconds, default_owner
from dibs._errors import InvalidArgument
from dibs.metrics import checked_metrics_port


@dataclass(frozen=True)
class WorkerSettings:
    """How a worker runs; see :class:`~dibs.queue.worker.Worker` for what each setting means."""

    #: The queues it takes jobs from, sorted.
    queues: tuple[str, ...]
    #: The version/capability tags it has, sorted: it takes jobs with no tag or one of these.
    tags: tuple[str, ...]
    concurrency: int
    batch: int
    lease_seconds: float
    heartbeat_seconds: float
    poll_seconds: float
    grace_seconds: float
    upkeep_seconds: float
    retention: timedelta | None
    burst: bool
    #: Its lease owner name, unique to this worker.
    name: str
    metrics_port: int | None
    metrics_address: str
    handle_signals: bool
    #: Database connections for its statements, 1 or 2 (None: the database's default).
    connections: int | None
    tune_gc: bool


def worker_settings(
    app_queues: frozenset[str],
    *,
    queues: Iterable[str] | None = None,
    tags: Iterable[str] = (),
    concurrency: int = 10,
    batch: int | None = None,
    lease: float = 30.0,
    heartbeat: float | None = None,
    poll: float = 2.0,
    grace: float = 30.0,
    upkeep_every: float = 1.0,
    retention: timedelta | None = None,
    burst: bool = False,
    name: str | None = None,
    metrics_port: int | None = None,
    metrics_address: str = "127.0.0.1",
    handle_signals: bool = True,
    connections: int | None = None,
    tune_gc: bool = False,
) -> WorkerSettings:
    """The settings of a worker of an app serving ``app_queues``; InvalidArgument, saying what fits, for the
    first one out of range."""
    chosen = _chosen_queues(app_queues, queues)
    concurrency = checked_count(concurrency, "concurrency")
    lease_seconds = checked_seconds(lease, "lease")
    if connections is not None and (type(connections) is not int or connections not in (1, 2)):
        raise InvalidArgument(
            f"connections must be 1 or 2, got {connections!r}: 2 lets a claim run while successes are "
            "written, 1 has them take turns"
        )
    if metrics_port is not None:
        checked_metrics_port(metrics_port)
    if not isinstance(metrics_address, str) or not metrics_address:
        raise InvalidArgument(f"metrics_address must be a host name or IP address, got {metrics_address!r}")
    return WorkerSettings(
        queues=chosen,
        tags=tuple(sorted(checked_name(tag, "a tag") for tag in tags)),
        concurrency=concurrency,
        batch=concurrency if batch is None else checked_count(batch, "batch"),
        lease_seconds=lease_seconds,
        heartbeat_seconds=_heartbeat(lease_seconds, heartbeat),
        poll_seconds=checked_seconds(poll, "poll"),
        grace_seconds=checked_seconds(grace, "grace", zero=True),
        upkeep_seconds=checked_seconds(upkeep_every, "upkeep_every"),
        retention=None if retention is None else timedelta(seconds=checked_seconds(retention, "retention", zero=True)),
        burst=burst,
        name=checked_owner(name or default_owner(), "name"),
        metrics_port=metrics_port,
        metrics_address=metrics_address,
        handle_signals=handle_signals,
        connections=connections,
        tune_gc=tune_gc,
    )


def _chosen_queues(app_queues: frozenset[str], queues: Iterable[str] | None) -> tuple[str, ...]:
    chosen = app_queues if queues is None else frozenset(checked_name(queue, "a queue name") for queue in queues)
    unknown = chosen - app_queues
    if unknown:
        raise InvalidArgument(
            f"no task is on queue(s) {', '.join(sorted(unknown))}; this app's queues: "
            f"{', '.join(sorted(app_queues)) or 'none (register a task first)'}"
        )
    if not chosen and app_queues:
        raise InvalidArgument(
            f"queues= (--queues) names no queue; name some of this app's: {', '.join(sorted(app_queues))}"
        )
    if not chosen:
        raise InvalidArgument("this app has no tasks; register at least one with @app.task before running a worker")
    return tuple(sorted(chosen))


def _heartbeat(lease_seconds: float, heartbeat: float | None) -> float:
    seconds = lease_seconds / 3 if heartbeat is None else checked_seconds(heartbeat, "heartbeat")
    if not seconds < lease_seconds:
        raise InvalidArgument(
            f"heartbeat must be a positive number of seconds below the lease ({lease_seconds:g}), got {heartbeat!r}; "
            "a third of the lease (the default) renews it twice before it could expire"
        )
    return seconds
