"""The databases, drivers and claim strategies every conformance test runs against.

A *target* is one backend x driver x strategy. Server URLs come from the environment (the defaults are
the services on loopback); each test session works in a database of its own and drops it at the end.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

POSTGRES_URL = os.environ.get("DIBS_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
MARIADB_URL = os.environ.get("DIBS_TEST_MARIADB_URL", "mysql+pymysql://root@127.0.0.1:3306/test")
IN_CI = os.environ.get("CI", "").lower() == "true"
#: The driver each family's sync and asyncio tests use, by family.
SYNC_DRIVERS = {"postgresql": "postgresql+psycopg", "sqlite": "sqlite+pysqlite", "mariadb": "mysql+pymysql"}
ASYNC_DRIVERS = {"postgresql": "postgresql+psycopg", "sqlite": "sqlite+aiosqlite", "mariadb": "mysql+asyncmy"}


@dataclass(frozen=True)
class Target:
    """One way of reaching one database: the family, the driver, sync or async, and the claim strategy."""

    family: str  # postgresql, sqlite, mariadb
    driver: str  # the SQLAlchemy "dialect+driver" name
    is_async: bool
    strategy: str | None = None  # None: the backend's native strategy
    memory: bool = False  # SQLite :memory:, one shared connection

    @property
    def id(self) -> str:
        where = "memory" if self.memory else self.driver.split("+")[1]
        return f"{self.family}-{where}{'-async' if self.is_async else ''}-{self.strategy or 'native'}"

    @property
    def sync_driver(self) -> str:
        return {"postgresql": "postgresql+psycopg", "mariadb": "mysql+pymysql", "sqlite": "sqlite+pysqlite"}[
            self.family
        ]

    @property
    def orders_nulls(self) -> bool:
        """Whether ORDER BY takes NULLS FIRST / NULLS LAST (MySQL and MariaDB do not)."""
        return self.family != "mariadb"

    @property
    def concurrent_writers(self) -> bool:
        """Whether another connection can write while this one holds a transaction open (SQLite: one writer)."""
        return self.family != "sqlite"

    @property
    def shared_across_processes(self) -> bool:
        return not self.memory


def _targets() -> list[Target]:
    found = []
    for strategy in (None, "portable"):
        found += [
            Target("postgresql", "postgresql+psycopg", False, strategy),
            Target("postgresql", "postgresql+psycopg", True, strategy),
            Target("postgresql", "postgresql+asyncpg", True, strategy),
            Target("mariadb", "mysql+pymysql", False, strategy),
            Target("mariadb", "mysql+asyncmy", True, strategy),
        ]
    for strategy in (None, "sqlite-legacy", "portable"):
        found += [
            Target("sqlite", "sqlite+pysqlite", False, strategy),
            Target("sqlite", "sqlite+pysqlite", False, strategy, memory=True),
            Target("sqlite", "sqlite+aiosqlite", True, strategy),
        ]
    return found


TARGETS = _targets()


def with_driver(url: str | sa.URL, driver: str) -> sa.URL:
    """The same database reached through another driver."""
    return sa.make_url(url).set(drivername=driver)


def database_url(request: Any, family: str, driver: str, sqlite_file: Path | None) -> sa.URL:
    """The test session's database on the PostgreSQL or MariaDB server, or an SQLite file (in memory when
    ``sqlite_file`` is None), with ``driver``. ``request`` is the asking fixture's."""
    if family == "postgresql":
        base: sa.URL = request.getfixturevalue("postgres_database")
    elif family == "mariadb":
        base = request.getfixturevalue("mariadb_database")
    else:
        base = sa.make_url("sqlite://" if sqlite_file is None else f"sqlite:///{sqlite_file}")
    return with_driver(base, driver)
