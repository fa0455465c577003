"""A server too old for its fast path: a warning that says so, once per engine, and a correct slower claim."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

import dibs
from tests.conformance.tables import work_columns
from tests.helpers.targets import with_driver


def claim_on_old_server(engine: sa.Engine, version: tuple[int, ...]) -> list[list[int]]:
    work = sa.Table("old_server_work", sa.MetaData(), *work_columns())
    work.create(engine)
    try:
        with engine.begin() as conn:
            conn.execute(work.insert(), [{"id": i} for i in range(1, 6)])
        engine.dialect.server_version_info = version  # as the server would have reported it
        ready = work.c.status == "ready"
        return [
            [row.id for row in dibs.claim(engine, work, where=ready, set={"status": "running"}, limit=3, order_by="id")]
            for _ in range(2)
        ]
    finally:
        work.drop(engine)


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[sa.Engine]:
    engine = dibs.create_engine(f"sqlite:///{tmp_path / 'old.sqlite'}")
    yield engine
    engine.dispose()


def test_sqlite_without_returning(sqlite_engine: sa.Engine) -> None:
    with pytest.warns(dibs.FallbackWarning, match=r"SQLite 3\.34\.0 has no RETURNING .*correct but slower"):
        claimed = claim_on_old_server(sqlite_engine, (3, 34, 0))
    assert claimed == [[1, 2, 3], [4, 5]]


def test_postgresql_without_skip_locked(postgres_database: sa.URL) -> None:
    engine = dibs.create_engine(with_driver(postgres_database, "postgresql+psycopg"))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            claimed = claim_on_old_server(engine, (9, 4))
        assert [str(w.message) for w in caught if w.category is dibs.FallbackWarning] == [
            "PostgreSQL 9.4 has no SKIP LOCKED (PostgreSQL 9.5 and later do); dibs falls back to the portable "
            "guarded-update claim, which is correct but slower."
        ]  # once, though the engine claimed twice
        assert claimed == [[1, 2, 3], [4, 5]]
    finally:
        engine.dispose()


def test_mariadb_without_skip_locked(mariadb_database: sa.URL) -> None:
    engine = dibs.create_engine(with_driver(mariadb_database, "mysql+pymysql"))
    try:
        with pytest.warns(dibs.FallbackWarning, match=r"MariaDB 10\.5\.9 has no SKIP LOCKED \(MariaDB 10\.6"):
            claimed = claim_on_old_server(engine, (10, 5, 9))
        assert claimed == [[1, 2, 3], [4, 5]]
    finally:
        engine.dispose()
