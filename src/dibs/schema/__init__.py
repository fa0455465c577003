"""The library's own tables, their column types and their migrations.

The package by concern: ``types`` (column types), ``states`` (job and event states), ``tables`` (the
tables and their indexes, described there), ``migrations`` (:func:`migrate`), ``status`` (whether a
database has the tables this dibs needs).
"""

from dibs.schema.database import DibsDatabase
from dibs.schema.migrations import (
    LATEST,
    MIGRATE_TRIES,
    MIGRATIONS,
    Migration,
    current_version,
    migrate,
    tables_and_version,
)
from dibs.schema.states import (
    ABANDONED,
    CANCELLED,
    DEAD,
    DEFAULT_TARGET,
    EVENT_STATES,
    FAILED,
    FINISHED,
    LIVE,
    PENDING,
    PROCESSING,
    PUBLISHED,
    QUEUED,
    RUNNING,
    SCHEDULED,
    STATES,
    SUCCEEDED,
)
from dibs.schema.status import missing_tables, require_current, schema_problem, tables_checked, translated
from dibs.schema.tables import (
    DEAD_AFTER_LEASES,
    JOBS,
    OUTBOX,
    PERIODIC,
    SCHEMA,
    WORKERS,
    jobs,
    metadata,
    outbox,
    periodic,
    schema_versions,
    workers,
)
from dibs.schema.types import LongText, Timestamp, aware

__all__ = [
    "ABANDONED",
    "CANCELLED",
    "DEAD",
    "DEAD_AFTER_LEASES",
    "DEFAULT_TARGET",
    "EVENT_STATES",
    "FAILED",
    "FINISHED",
    "JOBS",
    "LATEST",
    "LIVE",
    "MIGRATE_TRIES",
    "MIGRATIONS",
    "OUTBOX",
    "PENDING",
    "PERIODIC",
    "PROCESSING",
    "PUBLISHED",
    "QUEUED",
    "RUNNING",
    "SCHEDULED",
    "SCHEMA",
    "STATES",
    "SUCCEEDED",
    "WORKERS",
    "DibsDatabase",
    "LongText",
    "Migration",
    "Timestamp",
    "aware",
    "current_version",
    "jobs",
    "metadata",
    "migrate",
    "missing_tables",
    "outbox",
    "periodic",
    "require_current",
    "schema_problem",
    "schema_versions",
    "tables_and_version",
    "tables_checked",
    "translated",
    "workers",
]
