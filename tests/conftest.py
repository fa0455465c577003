"""Fixtures: a database per session on each server, and a fresh table per test on each target."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.harness import Harness
from tests.targets import IN_CI, MARIADB_URL, POSTGRES_URL, TARGETS, Target, database_url, with_driver

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


def target_url(request: pytest.FixtureRequest, target: Target, tmp_path: Path) -> sa.URL:
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
