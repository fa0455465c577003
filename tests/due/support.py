"""What the due scheduler tests share: the user's table of sources, times on the database's clock, and a log
of handler runs that worker processes and threads write."""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

import dibs

SOURCES = "dibs_test_due_sources"
#: The same table before the scheduler's columns were added (for add_due_columns).
PLAIN_SOURCES = "dibs_test_due_plain"
#: A schema (PostgreSQL) whose statement_timestamp() runs an hour behind the real one.
SLOW_CLOCK_SCHEMA = "dibs_test_due_slow_clock"

#: An interval no test waits out: a source run once is not due again during the test.
HOUR = timedelta(hours=1)


def sources_table(metadata: sa.MetaData | None = None, name: str = SOURCES, *, due: bool = True) -> sa.Table:
    """The user's table of sources (feeds, say): a key, a last run, an on/off switch, per-row intervals in
    seconds and in minutes, a priority; and, unless ``due=False``, the scheduler's own columns."""
    return sa.Table(
        name,
        metadata if metadata is not None else sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("url", sa.String(200), nullable=True),
        sa.Column("last_run_at", dibs.Timestamp, nullable=True),
        sa.Column("enabled", sa.Boolean, nullable=False, server_default=sa.true()),
        sa.Column("every_seconds", sa.Integer, nullable=True),
        sa.Column("every_minutes", sa.Integer, nullable=True),
        sa.Column("priority", sa.Integer, nullable=True),
        *(dibs.due_columns() if due else []),
    )


def family_of(bind: sa.URL | Engine) -> str:
    name = (bind.url if isinstance(bind, Engine) else bind).get_backend_name()
    return "mariadb" if name in ("mysql", "mariadb") else name


def aware(moment: datetime | None) -> datetime | None:
    """A time read back from the database, in UTC with its tzinfo (MariaDB and SQLite store naive UTC)."""
    if moment is None:
        return None
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


def database_now(bind: Engine | sa.Connection) -> datetime:
    """The database's clock, in UTC, to the microsecond (SQLite runs in-process: its clock is the application's)."""
    if bind.dialect.name == "sqlite":
        return datetime.now(timezone.utc)
    query = "SELECT clock_timestamp()" if bind.dialect.name == "postgresql" else "SELECT UTC_TIMESTAMP(6)"
    if isinstance(bind, Engine):
        with bind.connect() as conn:
            moment = conn.execute(sa.text(query)).scalar_one()
    else:
        moment = bind.execute(sa.text(query)).scalar_one()
    result = aware(moment)
    assert result is not None
    return result


def storable(bind: Engine, moment: datetime) -> datetime:
    """``moment`` as the table's Timestamp column takes it: aware on PostgreSQL, naive UTC elsewhere."""
    utc = moment.astimezone(timezone.utc)
    return utc if bind.dialect.name == "postgresql" else utc.replace(tzinfo=None)


@dataclass(frozen=True)
class Run:
    """One handler run: which source, which worker, the token its lease had, and when (wall clock)."""

    id: int
    worker: str
    token: int
    start: float
    end: float


class RunLog:
    """Handler runs, recorded by threads of this process or as JSON lines by worker processes."""

    def __init__(self) -> None:
        self.runs: list[Run] = []
        self._lock = threading.Lock()

    def add(self, run: Run) -> None:
        with self._lock:
            self.runs.append(run)

    @classmethod
    def read(cls, *paths: Path) -> RunLog:
        log = cls()
        for path in paths:
            if path.exists():
                for line in path.read_text().splitlines():
                    log.add(Run(**json.loads(line)))
        return log

    def by_source(self) -> dict[int, list[Run]]:
        found: dict[int, list[Run]] = defaultdict(list)
        for run in sorted(self.runs, key=lambda run: run.start):
            found[run.id].append(run)
        return dict(found)
