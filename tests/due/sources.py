"""One due scheduler test's sources table and the engines on it, and dropping the test tables."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

import dibs
from tests.due.support import (
    PLAIN_SOURCES,
    SLOW_CLOCK_SCHEMA,
    SOURCES,
    aware,
    database_now,
    family_of,
    sources_table,
    storable,
)


def drop_tables(url: sa.URL) -> None:
    """Drop the test tables (and PostgreSQL's slow clock), failing fast if a leftover session holds a lock."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql("SET lock_timeout = '10s'")
            elif conn.dialect.name in ("mysql", "mariadb"):
                conn.exec_driver_sql("SET SESSION lock_wait_timeout = 10")
            for name in (SOURCES, PLAIN_SOURCES):
                sa.Table(name, sa.MetaData()).drop(conn, checkfirst=True)
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {SLOW_CLOCK_SCHEMA} CASCADE")
            conn.commit()
    finally:
        engine.dispose()


class Sources:
    """One test's sources table and the engines on it, all disposed when the test ends."""

    def __init__(self, url: sa.URL) -> None:
        self.url = url
        self.family = family_of(url)
        self._engines: list[Engine] = []
        self.engine = self.new_engine()
        self.table = sources_table()
        self.table.metadata.create_all(self.engine)

    def new_engine(self, **options: Any) -> Engine:
        engine = dibs.create_engine(self.url, **options)
        self._engines.append(engine)
        return engine

    def scheduler(self, **options: Any) -> dibs.DueScheduler:
        """A scheduler on the table (enabled and priority by default; an interval must be given)."""
        return dibs.DueScheduler(self.table, **{"last_run": "last_run_at", "enabled": "enabled", **options})

    def now(self) -> datetime:
        return database_now(self.engine)

    def ago(self, seconds: float, now: datetime | None = None) -> datetime:
        """A last run ``seconds`` before the database's now (or before ``now``), as the column takes it."""
        return storable(self.engine, (now or self.now()) - timedelta(seconds=seconds))

    def add(self, *rows: dict[str, Any]) -> None:
        """Insert sources; each is enabled, never run, of priority 0, unless its dict says otherwise."""
        filled = [{"last_run_at": None, "enabled": True, "priority": 0, **row} for row in rows]
        columns = {key for row in filled for key in row}
        with self.engine.begin() as conn:
            conn.execute(self.table.insert(), [{key: row.get(key) for key in columns} for row in filled])

    def update(self, source: int, **values: Any) -> None:
        with self.engine.begin() as conn:
            conn.execute(self.table.update().where(self.table.c.id == source).values(**values))

    def row(self, source: int) -> sa.Row[Any]:
        with self.engine.connect() as conn:
            return conn.execute(sa.select(self.table).where(self.table.c.id == source)).one()

    def rows(self) -> dict[int, sa.Row[Any]]:
        with self.engine.connect() as conn:
            return {row.id: row for row in conn.execute(sa.select(self.table).order_by(self.table.c.id))}

    def last_run(self, source: int) -> datetime | None:
        return aware(self.row(source).last_run_at)

    def close(self) -> None:
        for engine in self._engines:
            engine.dispose()
