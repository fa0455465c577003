"""dibs: many consumers share one SQL table without ever taking the same row twice."""

from __future__ import annotations

from dibs._errors import (
    BrokerUnavailable,
    Busy,
    DibsError,
    DibsWarning,
    EventNotFound,
    FallbackWarning,
    InEventLoop,
    InTransaction,
    InvalidArgument,
    JobFailed,
    JobNotFound,
    LeaseLost,
    ResultTimeout,
    SchemaMissing,
    UnknownQueue,
    UnknownTask,
)
from dibs.claim import aclaim, claim
from dibs.due import DueScheduler, DueStats, add_due_columns, due_columns
from dibs.engine import create_async_engine, create_engine
from dibs.lease import Claimer, Lease, Leases, lease_columns
from dibs.outbox import Outbox, OutboxEvent, OutboxStatus, Relay, RelaySettings, RelayStats
from dibs.queue import (
    App,
    Job,
    JobContext,
    QueueStatus,
    Retry,
    Step,
    StrandedJobs,
    Task,
    Worker,
    WorkerStats,
    WorkerStatus,
)
from dibs.schema import Timestamp, migrate

__version__ = "0.1.0.dev0"

__all__ = [
    "App",
    "BrokerUnavailable",
    "Busy",
    "Claimer",
    "DibsError",
    "DibsWarning",
    "DueScheduler",
    "DueStats",
    "EventNotFound",
    "FallbackWarning",
    "InEventLoop",
    "InTransaction",
    "InvalidArgument",
    "Job",
    "JobContext",
    "JobFailed",
    "JobNotFound",
    "Lease",
    "LeaseLost",
    "Leases",
    "Outbox",
    "OutboxEvent",
    "OutboxStatus",
    "QueueStatus",
    "Relay",
    "RelaySettings",
    "RelayStats",
    "ResultTimeout",
    "Retry",
    "SchemaMissing",
    "Step",
    "StrandedJobs",
    "Task",
    "Timestamp",
    "UnknownQueue",
    "UnknownTask",
    "Worker",
    "WorkerStats",
    "WorkerStatus",
    "aclaim",
    "add_due_columns",
    "claim",
    "create_async_engine",
    "create_engine",
    "due_columns",
    "lease_columns",
    "migrate",
]
