"""The SQL `dibs sql` prints builds the dibs schema by hand, and Alembic's autogenerate leaves the dibs tables
alone with dibs.alembic.include_object, on the servers DBAs run it on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.operations import Operations

import dibs
from dibs.alembic import include_object
from dibs.schema import LATEST, current_version, metadata
from dibs.schema.script import migration_sql, migration_statements
from tests.acceptance.cli import dibs as run_dibs
from tests.helpers.targets import SYNC_DRIVERS, database_url
from tests.queue.support import drop_everything, without_later_job_columns

SERVERS = ["postgresql", "mariadb"]


@pytest.fixture(params=SERVERS)
def server_url(request: pytest.FixtureRequest) -> Iterator[sa.URL]:
    url = database_url(request, request.param, SYNC_DRIVERS[request.param], None)
    drop_everything(url)
    yield url
    drop_everything(url)


def apply_by_hand(url: sa.URL, script: str) -> None:
    """Run each statement of ``script`` as a DBA's client would."""
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for statement in script.split(";\n"):
            lines = [line for line in statement.splitlines() if not line.startswith("--")]
            if "".join(lines).strip():
                conn.exec_driver_sql("\n".join(lines).rstrip(";"))
    engine.dispose()


def test_the_printed_sql_builds_a_schema_that_migrate_sees_as_current(server_url: sa.URL, tmp_path: Path) -> None:
    dialect = "postgresql" if server_url.get_backend_name() == "postgresql" else "mariadb"
    printed = run_dibs("sqlite:///unused.sqlite", tmp_path, "sql", "--dialect", dialect)
    assert printed.returncode == 0, printed.stderr
    apply_by_hand(server_url, printed.stdout)
    engine = sa.create_engine(server_url)
    try:
        assert current_version(engine) == LATEST
        assert dibs.migrate(engine) == []
        assert set(sa.inspect(engine).get_table_names()) >= set(metadata.tables)
    finally:
        engine.dispose()


def test_the_sql_of_later_steps_upgrades_a_database_migrated_that_far(server_url: sa.URL) -> None:
    dialect = "postgresql" if server_url.get_backend_name() == "postgresql" else "mariadb"
    engine = sa.create_engine(server_url)
    try:
        dibs.migrate(engine, dibs.schema.MIGRATIONS[:3])
        without_later_job_columns(engine)
        apply_by_hand(server_url, migration_sql(dialect, start=3))
        assert current_version(engine) == LATEST
        assert dibs.migrate(engine) == []
    finally:
        engine.dispose()


def test_autogenerate_with_the_helper_finds_no_dibs_difference(server_url: sa.URL) -> None:
    engine = sa.create_engine(server_url)
    mine = sa.MetaData()
    sa.Table("orders", mine, sa.Column("id", sa.Integer, primary_key=True))
    try:
        dibs.migrate(engine)
        with engine.connect() as conn:
            plain = compare_metadata(MigrationContext.configure(conn), mine)
            helped = MigrationContext.configure(conn, opts={"include_object": include_object})
            diff = compare_metadata(helped, mine)
        assert any("dibs_" in repr(change) for change in plain), "without the helper autogenerate drops dibs tables"
        assert diff, "the project's own table still shows"
        assert all("dibs_" not in repr(change) for change in diff), diff
    finally:
        engine.dispose()


def test_the_sql_command_refuses_a_step_range_backwards(tmp_path: Path) -> None:
    printed = run_dibs("sqlite:///unused.sqlite", tmp_path, "sql", "--from", "3", "--to", "1")
    assert printed.returncode != 0
    assert "start <= end" in printed.stderr


def test_an_alembic_revision_running_the_statements_builds_a_schema_migrate_sees_as_current(
    server_url: sa.URL,
) -> None:
    engine = sa.create_engine(server_url)
    try:
        with engine.begin() as conn:  # the transaction Alembic runs a revision's upgrade() in
            operations = Operations(MigrationContext.configure(conn))
            for statement in migration_statements(conn.dialect):
                operations.execute(statement)
        assert current_version(engine) == LATEST
        assert dibs.migrate(engine) == []
    finally:
        engine.dispose()
