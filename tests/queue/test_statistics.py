"""A new jobs table's first statistics: on PostgreSQL a worker gathers them once the table has grown, if
autovacuum has not yet, so that statements its connections planned on a near-empty table are planned again.
Elsewhere a connection keeps no plan, and there is nothing to gather."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Engine

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


def test_a_worker_analyzes_a_new_jobs_table_once_it_has_grown(qdb: QueueDatabase) -> None:
    app = qdb.app()

    @app.task(name="noop")
    def noop(n: int) -> None:
        return None

    if qdb.family != "postgresql":
        assert app.store.gather_first_statistics(app.engine) is True
        return
    with qdb.engine.begin() as conn:  # only dibs may analyze it here
        conn.exec_driver_sql("ALTER TABLE dibs_jobs SET (autovacuum_enabled = false)")
    app.enqueue_many("noop", [{"n": n} for n in range(100)])
    wait_until(lambda: statistics_state(qdb.engine)[2] == 100, timeout=30, what="the server counted 100 rows")
    # A table this small is best read whole: its statements' plans are left as they are.
    assert app.store.gather_first_statistics(app.engine) is False
    assert statistics_state(qdb.engine)[0] is False

    app.enqueue_many("noop", [{"n": n} for n in range(FIRST_STATISTICS_ROWS)])
    qdb.start(app)
    wait_until(lambda: statistics_state(qdb.engine)[0], timeout=30, what="the worker analyzed the jobs table")
    analyzed, autoanalyzed, _ = statistics_state(qdb.engine)
    assert analyzed
    assert not autoanalyzed
    # Once there, the statistics are autovacuum's to keep: nothing is left to do.
    assert app.store.gather_first_statistics(app.engine) is True
