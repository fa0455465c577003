"""The suite's fixtures, as one pytest plugin (registered by the root conftest): a database per session on
each server, a fresh table per conformance target, and a fresh dibs database per queue, outbox or due test.

Every fixture is available to every test; a test module may override one by defining its own.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

import dibs
from dibs.schema import metadata
from tests.due.sources import Sources, drop_tables
from tests.helpers import BACKENDS
from tests.helpers.harness import Harness
from tests.helpers.targets import (
    IN_CI,
    MARIADB_URL,
    POSTGRES_URL,
    SYNC_DRIVERS,
    TARGETS,
    Target,
    database_url,
    with_driver,
)
from tests.outbox.support import OutboxDatabase
from tests.queue.database import QueueDatabase
from tests.queue.support import drop_everything

_session_database = f"dibs_test_{os.getpid()}"
_table_numbers = itertools.count()


def _unreachable(name: str, url: str, env: str, exc: Exception) -> None:
    where = sa.make_url(url).render_as_string(hide_password=True)
    message = (
        f"{name} is not reachable at {where} ({exc.__class__.__name__}: {str(exc).splitlines()[0]}). "
        f"Start it, or point {env} at one; scripts/test starts a throwaway server "
        "when none is running."
    )
    if IN_CI:
        pytest.fail(f"CI needs every backend: {message}", pytrace=False)
    pytest.skip(message)


# -- the servers' databases -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[sa.URL]:
    """A database of this session's own on the PostgreSQL server, dropped at the end."""
    admin = sa.create_engine(with_driver(POSTGRES_URL, "postgresql+psycopg"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{_session_database}"')
            conn.exec_driver_sql(f'CREATE DATABASE "{_session_database}"')
    except sa.exc.OperationalError as exc:
        admin.dispose()
        _unreachable("PostgreSQL", POSTGRES_URL, "DIBS_TEST_POSTGRES_URL", exc)
    yield sa.make_url(POSTGRES_URL).set(database=_session_database)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{_session_database}" WITH (FORCE)')
    admin.dispose()


@pytest.fixture(scope="session")
def mariadb_database() -> Iterator[sa.URL]:
    """A database of this session's own on the MariaDB server, dropped at the end."""
    admin = sa.create_engine(with_driver(MARIADB_URL, "mysql+pymysql"))
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{_session_database}`")
            conn.exec_driver_sql(f"CREATE DATABASE `{_session_database}`")
    except sa.exc.OperationalError as exc:
        admin.dispose()
        _unreachable("MariaDB", MARIADB_URL, "DIBS_TEST_MARIADB_URL", exc)
    yield sa.make_url(MARIADB_URL).set(database=_session_database)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{_session_database}`")
    admin.dispose()


# -- conformance: one target, fresh tables ------------------------------------------------------------------


def target_url(request: pytest.FixtureRequest, target: Target, tmp_path: Path) -> sa.URL:
    """The URL of ``target``'s database: the session's on a server, a file in tmp_path or memory on SQLite."""
    return database_url(request, target.family, target.driver, None if target.memory else tmp_path / "dibs.sqlite")


@pytest.fixture(params=TARGETS, ids=[target.id for target in TARGETS])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    """One target, with a fresh engine; tables it creates are dropped afterwards."""
    target: Target = request.param
    harness = Harness(target, target_url(request, target, tmp_path), table_prefix=f"t{next(_table_numbers)}_")
    try:
        yield harness
    finally:
        harness.close()


# -- acceptance: a URL for the command line -------------------------------------------------------------------


@pytest.fixture(params=BACKENDS)
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database URL with no dibs tables in it; they are dropped afterwards."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'cli.sqlite'}"
    else:
        base: sa.URL = request.getfixturevalue(f"{'postgres' if request.param == 'postgresql' else 'mariadb'}_database")
        url = base.render_as_string(hide_password=False)
    engine = sa.create_engine(url)
    metadata.drop_all(engine)
    yield url
    metadata.drop_all(engine)
    engine.dispose()


# -- the queue ------------------------------------------------------------------------------------------------


@pytest.fixture(params=BACKENDS)
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.URL]:
    """A database without dibs tables (a file in tmp_path on SQLite; the session's database on the servers)."""
    family: str = request.param
    url = database_url(request, family, SYNC_DRIVERS[family], tmp_path / "queue.sqlite")
    drop_everything(url)
    yield url
    drop_everything(url)


@pytest.fixture
def queue_url(empty_url: sa.URL) -> sa.URL:
    """A database with a fresh, current dibs schema."""
    engine = dibs.create_engine(empty_url)
    try:
        dibs.migrate(engine)
    finally:
        engine.dispose()
    return empty_url


@pytest.fixture
def qdb(queue_url: sa.URL) -> Iterator[QueueDatabase]:
    """The test's queue database: apps and workers on it, all closed when the test ends."""
    database = QueueDatabase(queue_url)
    try:
        yield database
    finally:
        database.close()


@pytest.fixture
def empty_db(empty_url: sa.URL) -> Iterator[QueueDatabase]:
    """A queue database without dibs tables."""
    database = QueueDatabase(empty_url)
    try:
        yield database
    finally:
        database.close()


# -- the outbox -----------------------------------------------------------------------------------------------


@pytest.fixture(params=BACKENDS)
def outbox_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.URL]:
    """A database with a fresh, current dibs schema (a file in tmp_path on SQLite; the session's database
    on the servers), its tables dropped after the test."""
    family: str = request.param
    url = database_url(request, family, SYNC_DRIVERS[family], tmp_path / "outbox.sqlite")
    drop_everything(url)
    engine = dibs.create_engine(url)
    try:
        dibs.migrate(engine)
    finally:
        engine.dispose()
    yield url
    drop_everything(url)


@pytest.fixture
def odb(outbox_url: sa.URL) -> Iterator[OutboxDatabase]:
    """The test's database: engines, outboxes and relays on it, all closed when the test ends."""
    database = OutboxDatabase(outbox_url)
    try:
        yield database
    finally:
        database.close()


# -- the due scheduler ----------------------------------------------------------------------------------------


@pytest.fixture(params=BACKENDS)
def due_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.URL]:
    """A database without the test tables (a file in tmp_path on SQLite; the session's database on the servers)."""
    family: str = request.param
    url = database_url(request, family, SYNC_DRIVERS[family], tmp_path / "due.sqlite")
    drop_tables(url)
    yield url
    drop_tables(url)


@pytest.fixture
def sources(due_url: sa.URL) -> Iterator[Sources]:
    """The test's sources table and the engines on it, all disposed when the test ends."""
    database = Sources(due_url)
    try:
        yield database
    finally:
        database.close()
