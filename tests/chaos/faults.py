"""Infrastructure faults the chaos scenarios inflict on running workers: a pool's connections held by other
code, a snapshot held open for a whole run, an SQLite reader that keeps the WAL from being checkpointed, and
an SQLite writer of another program that keeps taking the write lock."""

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
    """A REPEATABLE READ transaction whose snapshot stays open until :meth:`close`.

    PostgreSQL: while it is open, vacuum cannot remove any row version that died after it began (the
    xmin horizon is held back), so every claim and completion leaves dead tuples behind. MariaDB (InnoDB):
    its read view keeps purge from removing any undo log committed after it, so the history list grows."""

    def __init__(self, url: sa.URL) -> None:
        self.engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        self.family = "postgresql" if self.engine.dialect.name == "postgresql" else "mariadb"
        self.conn = self.engine.connect().execution_options(isolation_level="REPEATABLE READ")
        self.conn.begin()
        if self.family == "mariadb":
            self.conn.exec_driver_sql("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        # PostgreSQL takes the snapshot at the first statement, not at BEGIN.
        self.jobs_seen = self._count()

    def _count(self) -> int:
        return int(self.conn.execute(sa.text("SELECT count(*) FROM dibs_jobs")).scalar_one())

    def still_held(self) -> bool:
        """The transaction is open and still sees the job count it saw at the start (the same snapshot)."""
        return self._count() == self.jobs_seen

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.rollback()
            self.conn.close()
        self.engine.dispose()


def history_list_length(engine: Engine) -> int:
    """MariaDB: undo logs committed and not yet purged, server-wide."""
    with engine.connect() as conn:
        found = conn.execute(sa.text("SHOW GLOBAL STATUS LIKE 'Innodb_history_list_length'")).one()
    return int(found[1])


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


class SQLiteWriteHog:
    """Another program's writer on an SQLite file: in a thread, it takes the write lock (BEGIN IMMEDIATE)
    for ``hold`` seconds, lets it go for ``gap`` seconds, and again, until closed. It takes no turn of
    dibs's, so dibs's writers meet it on SQLite's lock, and past their busy timeout get dibs.Busy."""

    def __init__(self, path: Path, hold: float, gap: float) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, timeout=10, check_same_thread=False)
        self.hold, self.gap = hold, gap
        self.held = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sqlite-write-hog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.conn.execute("BEGIN IMMEDIATE")
            self.held += 1
            self._stop.wait(self.hold)
            self.conn.execute("COMMIT")
            self._stop.wait(self.gap)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.conn.close()
