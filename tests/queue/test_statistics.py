"""A new jobs table's first statistics: on PostgreSQL a worker gathers them once the table has grown, if
autovacuum has not yet, so that statements its connections planned on a near-empty table are planned again.
Elsewhere a connection keeps no plan, and there is nothing to gather."""

from __future__ import annotations

import logging
import uuid

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

import dibs
from dibs.dialects.statistics import FIRST_STATISTICS_ROWS
from tests.helpers import wait_until
from tests.queue.database import QueueDatabase

_STATE = sa.text(
    "SELECT last_analyze IS NOT NULL, last_autoanalyze IS NOT NULL, n_live_tup + n_dead_tup "
    "FROM pg_stat_all_tables WHERE relid = 'dibs_jobs'::regclass"
)


def statistics_state(engine: Engine) -> tuple[bool, bool, int]:
    """Whether the jobs table was analyzed by hand, by autovacuum, and the rows the server counts in it."""
    with engine.connect() as conn:
        analyzed, autoanalyzed, rows = conn.execute(_STATE).one()
    return bool(analyzed), bool(autoanalyzed), int(rows)


def noop_app(qdb: QueueDatabase) -> dibs.App:
    app = qdb.app()

    @app.task(name="noop")
    def noop(n: int) -> None:
        return None

    return app


def grow(qdb: QueueDatabase, app: dibs.App, rows: int) -> None:
    """Add ``rows`` jobs and wait until the server counts them; autovacuum is kept off the table, so that
    only dibs may analyze it here."""
    with qdb.engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE dibs_jobs SET (autovacuum_enabled = false)")
    before = statistics_state(qdb.engine)[2]
    app.enqueue_many("noop", [{"n": n} for n in range(rows)])
    wait_until(lambda: statistics_state(qdb.engine)[2] >= before + rows, timeout=30, what="the server counted them")


def test_a_worker_analyzes_a_new_jobs_table_once_it_has_grown(qdb: QueueDatabase) -> None:
    app = noop_app(qdb)
    if qdb.family != "postgresql":
        assert app.store.gather_first_statistics(app.engine) is True
        return
    grow(qdb, app, 100)
    # A table this small is best read whole: its statements' plans are left as they are.
    assert app.store.gather_first_statistics(app.engine) is False
    assert statistics_state(qdb.engine)[0] is False

    grow(qdb, app, FIRST_STATISTICS_ROWS)
    qdb.start(app)
    wait_until(lambda: statistics_state(qdb.engine)[0], timeout=30, what="the worker analyzed the jobs table")
    analyzed, autoanalyzed, _ = statistics_state(qdb.engine)
    assert analyzed
    assert not autoanalyzed
    # Once there, the statistics are autovacuum's to keep: nothing is left to do.
    assert app.store.gather_first_statistics(app.engine) is True


def test_of_workers_finding_the_table_unanalyzed_at_once_only_one_analyzes_it(qdb: QueueDatabase) -> None:
    if qdb.family != "postgresql":
        pytest.skip("only PostgreSQL keeps a statement's plan on a connection")
    app = noop_app(qdb)
    grow(qdb, app, FIRST_STATISTICS_ROWS)
    with qdb.engine.begin() as other:  # another worker, analyzing it now
        other.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext('dibs first statistics dibs_jobs'))"))
        assert app.store.gather_first_statistics(app.engine) is False
    assert statistics_state(qdb.engine)[0] is False
    assert app.store.gather_first_statistics(app.engine) is True
    assert statistics_state(qdb.engine)[0] is True


def test_a_role_that_does_not_own_the_table_leaves_it_to_autovacuum(
    qdb: QueueDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    if qdb.family != "postgresql":
        pytest.skip("only PostgreSQL keeps a statement's plan on a connection")
    app = noop_app(qdb)
    grow(qdb, app, FIRST_STATISTICS_ROWS)
    role = f"dibs_reader_{uuid.uuid4().hex[:8]}"
    with qdb.engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN")
    engine = dibs.create_engine(qdb.url.set(username=role))
    try:
        reader = dibs.App(engine)
        with caplog.at_level(logging.INFO, logger="dibs.statistics"):
            assert reader.store.gather_first_statistics(reader.engine) is True
        assert "left dibs_jobs to autovacuum to analyze: this role does not own it" in caplog.messages
        assert statistics_state(qdb.engine)[0] is False
    finally:
        engine.dispose()
        with qdb.engine.begin() as conn:
            conn.exec_driver_sql(f"DROP ROLE {role}")
