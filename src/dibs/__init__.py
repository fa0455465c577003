"""dibs: many consumers share one SQL table without ever taking the same row twice."""

from __future__ import annotations

from dibs._errors import (
    Busy,
    DibsError,
    DibsWarning,
    FallbackWarning,
    InTransaction,
    InvalidArgument,
    JobNotFound,
    LeaseLost,
    SchemaMissing,
    UnknownQueue,
    UnknownTask,
)
from dibs.claim import aclaim, claim
from dibs.engine import create_async_engine, create_engine
from dibs.lease import Claimer, Lease, Leases, lease_columns
from dibs.queue import App, Job, JobContext, QueueStatus, Retry, Task, Worker, WorkerStats
from dibs.schema import Timestamp, migrate

__version__ = "0.1.0.dev0"

__all__ = [
    "App",
    "Busy",
    "Claimer",
    "DibsError",
    "DibsWarning",
    "FallbackWarning",
    "InTransaction",
    "InvalidArgument",
    "Job",
    "JobContext",
    "JobNotFound",
    "Lease",
    "LeaseLost",
    "Leases",
    "QueueStatus",
    "Retry",
    "SchemaMissing",
    "Task",
    "Timestamp",
    "UnknownQueue",
    "UnknownTask",
    "Worker",
    "WorkerStats",
    "aclaim",
    "claim",
    "create_async_engine",
    "create_engine",
    "lease_columns",
    "migrate",
]
