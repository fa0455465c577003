"""A new outbox table's first statistics: on PostgreSQL a relay gathers them once the table has grown, if
autovacuum has not yet (see tests/queue/test_statistics.py for the jobs table)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dibs.dialects.statistics import FIRST_STATISTICS_ROWS
from tests.helpers import wait_until
from tests.outbox.support import OutboxDatabase, add_events, interleaved

_ANALYZED = sa.text(
    "SELECT last_analyze IS NOT NULL, last_autoanalyze IS NOT NULL FROM pg_stat_all_tables "
    "WHERE relid = 'dibs_outbox'::regclass"
)


def analyzed(engine: Engine) -> tuple[bool, bool]:
    """Whether the outbox table was analyzed by hand, and by autovacuum."""
    with engine.connect() as conn:
        by_hand, by_autovacuum = conn.execute(_ANALYZED).one()
    return bool(by_hand), bool(by_autovacuum)


def test_a_relay_analyzes_a_new_outbox_table_once_it_has_grown(odb: OutboxDatabase) -> None:
    outbox = odb.outbox()
    if odb.family != "postgresql":
        assert outbox.store.gather_first_statistics(outbox.engine) is True
        return
    with odb.engine.begin() as conn:  # only dibs may analyze it here
        conn.exec_driver_sql("ALTER TABLE dibs_outbox SET (autovacuum_enabled = false)")
    add_events(outbox, interleaved(aggregates=10, per_aggregate=FIRST_STATISTICS_ROWS // 10), per_transaction=1000)
    assert analyzed(odb.engine) == (False, False)
    odb.start(outbox, "log://")
    wait_until(lambda: analyzed(odb.engine)[0], timeout=30, what="the relay analyzed the outbox table")
    assert analyzed(odb.engine) == (True, False)
