"""Infrastructure faults the chaos scenarios inflict on running workers: a pool's connections held by other
code, a snapshot held open for a whole run, an SQLite reader that keeps the WAL from being checkpointed."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine


class HeldConnections:
    """Checks out connections of an engine's own pool and keeps them, so that the engine's other users
    wait for one (and time out, with a short ``pool_timeout``) until :meth:`give_back`.

    Each one runs a statement first, so they are real, open server sessions, not just pool slots."""

    def __init__(self, engine: Engine, count: int) -> None:
        self.engine = engine
        self.count = count
        self._held: list[sa.Connection] = []

    def take(self, timeout: float = 30.0) -> HeldConnections:
        """Take ``count`` connections, waiting for the engine's users to return them (each checkout may time
        out against the pool's own timeout: tried again until ``timeout``)."""
        deadline = time.monotonic() + timeout
        while len(self._held) < self.count:
            try:
                conn = self.engine.connect()
            except sa.exc.TimeoutError:
                if time.monotonic() > deadline:
                    self.give_back()
                    raise AssertionError(
                        f"could not take {self.count} connections of the pool within {timeout} s"
                    ) from None
                continue
            conn.execute(sa.text("SELECT 1"))
            conn.rollback()
            self._held.append(conn)
        return self

    @property
    def held(self) -> int:
        return len(self._held)

    def give_back(self) -> None:
        for conn in self._held:
            with contextlib.suppress(Exception):
                conn.close()
        self._held.clear()


class HeldSnapshot:
    """A PostgreSQL REPEATABLE READ transaction whose snapshot stays open until :meth:`close`: while it is
    open, vacuum cannot remove any row version that became dead after it began (the server's xmin horizon
    is held back), so every claimed-then-updated job leaves dead tuples behind."""

    def __init__(self, url: sa.URL) -> None:
        self.engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        self.conn = self.engine.connect().execution_options(isolation_level="REPEATABLE READ")
        self.conn.begin()
        # The snapshot is taken at the first statement, not at BEGIN.
        self.jobs_seen = self.conn.execute(sa.text("SELECT count(*) FROM dibs_jobs")).scalar_one()
        self.backend_xmin = self.conn.execute(
            sa.text("SELECT backend_xmin FROM pg_stat_activity WHERE pid = pg_backend_pid()")
        ).scalar_one()

    def still_held(self) -> bool:
        """The transaction is open and still sees the job count it saw at the start (the same snapshot)."""
        seen = self.conn.execute(sa.text("SELECT count(*) FROM dibs_jobs")).scalar_one()
        return bool(seen == self.jobs_seen)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.rollback()
            self.conn.close()
        self.engine.dispose()


def dead_tuples(engine: Engine, table: str = "dibs_jobs") -> int:
    """Dead row versions of a PostgreSQL table, counted exactly (pgstattuple is an extension: not assumed);
    from the statistics collector, which may lag a little."""
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT pg_stat_force_next_flush()"))
        found = conn.execute(
            sa.text("SELECT n_dead_tup FROM pg_stat_all_tables WHERE relname = :table"), {"table": table}
        ).scalar_one_or_none()
    return int(found or 0)


def vacuum(engine: Engine, table: str = "dibs_jobs") -> str:
    """VACUUM (VERBOSE) the table; the server's report of what it could not remove."""
    notices: list[str] = []
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        raw: Any = conn.connection.driver_connection
        raw.add_notice_handler(lambda diagnostic: notices.append(diagnostic.message_primary or ""))
        conn.execute(sa.text(f"VACUUM (VERBOSE) {table}"))
    return "\n".join(notices)


class LongSQLiteReader:
    """A connection to an SQLite file with a read transaction held open: writers go on (WAL), but no
    checkpoint can move the WAL past this reader's snapshot, so the WAL only grows while it is held."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("BEGIN")
        self.jobs_seen = self.conn.execute("SELECT count(*) FROM dibs_jobs").fetchone()[0]
        self._lock = threading.Lock()

    def still_held(self) -> bool:
        with self._lock:
            seen = self.conn.execute("SELECT count(*) FROM dibs_jobs").fetchone()[0]
        return bool(self.conn.in_transaction and seen == self.jobs_seen)

    def wal_bytes(self) -> int:
        wal = self.path.with_name(self.path.name + "-wal")
        return wal.stat().st_size if wal.exists() else 0

    def close(self) -> None:
        with self._lock, contextlib.suppress(Exception):
            self.conn.execute("COMMIT")
        self.conn.close()
