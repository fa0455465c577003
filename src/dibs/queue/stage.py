"""What every stage of one worker shares: the app it reads, and its database, threads, wake-up, leases, counts
and reports."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from sqlalchemy.engine import Engine

from dibs.metrics import QueueDepth
from dibs.queue.stats import WorkerStats
from dibs.queue.store import JobStore
from dibs.queue.task import Task
from dibs.runtime import DatabaseThreads, LeaseKeeper, Wakeup
from dibs.runtime.missing_tables import MissingTables


class WorkerApp(Protocol):
    """What a worker reads of the app whose jobs it runs (a :class:`dibs.App`)."""

    @property
    def engine(self) -> Engine: ...
    @property
    def store(self) -> JobStore: ...
    @property
    def tasks(self) -> Mapping[str, Task]: ...
    @property
    def queues(self) -> frozenset[str]: ...
    @property
    def schedules(self) -> Mapping[str, object]: ...
    @property
    def notify(self) -> bool: ...
    @property
    def async_engine_options(self) -> Mapping[str, Any]: ...
    def sync_periodic(self) -> None: ...
    def enqueue_periodic(self) -> int: ...
    def purge(self, *, older_than: timedelta = ..., statuses: Sequence[str] = ...) -> int: ...
    def status(self) -> Sequence[QueueDepth]: ...


@dataclass(frozen=True, kw_only=True)
class Shared:
    """The parts of a worker its stages (fetch, execute, writes) share, made once by the worker."""

    #: The jobs' statements.
    store: JobStore
    #: The database.
    engine: Engine
    #: The threads every database call runs on.
    threads: DatabaseThreads
    #: What the fetcher sleeps on; woken when work may be runnable.
    wakeup: Wakeup
    #: The leases of the jobs held: claimed and not yet finished.
    keeper: LeaseKeeper
    #: What the worker did.
    stats: WorkerStats
    #: Reports missing tables once a minute.
    missing: MissingTables
