"""A new queue table's first statistics on PostgreSQL, gathered by dibs when autovacuum has not yet.

PostgreSQL plans a statement prepared on a connection once it has run five times, and keeps that plan
until the table's statistics change. Planned while a new jobs table held a handful of rows, a claim or a
completion reads the whole table, which is cheapest then, and goes on doing so as the table grows, until
autovacuum first analyzes it: its naptime is a minute, and a busy queue adds tens of thousands of rows in
that time (measured: at 1,000 jobs a second, 3,600 rows read a statement after a few seconds, and twice
the enqueue-to-start latency). ANALYZE, once the table is big enough for its primary key to be the cheaper
way in, makes every connection plan its statements again; autovacuum keeps the statistics from then on.

Only a new table's first minutes are covered: a table autovacuum analyzed while it was small (drained, or
purged) is planned again at its next look.
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from sqlalchemy.engine import Connection

log = logging.getLogger("dibs.statistics")

#: Rows (live or dead) a never-analyzed table holds before dibs analyzes it: with statistics, PostgreSQL
#: 15 found the jobs of a claim by primary key from about 1,000 rows, and scanned a table of 300.
FIRST_STATISTICS_ROWS = 2_000

# Whether the table was ever analyzed, the rows it holds, and whether this role may analyze it (it owns it,
# or is a superuser); no row while the table does not exist.
_STATE = sa.text(
    "SELECT s.last_analyze IS NOT NULL OR s.last_autoanalyze IS NOT NULL, s.n_live_tup + s.n_dead_tup, "
    "pg_has_role(c.relowner, 'USAGE') FROM pg_stat_all_tables s JOIN pg_class c ON c.oid = s.relid "
    "WHERE s.relid = to_regclass(:name)"
)
# Of the workers that find the table unanalyzed at once, one analyzes it; the others see it done next turn.
_ONE_AT_A_TIME = sa.text("SELECT pg_try_advisory_xact_lock(hashtext('dibs first statistics ' || :name))")


def gather_first_statistics(conn: Connection, table: sa.Table, rows: int = FIRST_STATISTICS_ROWS) -> bool:
    """ANALYZE ``table`` if it has never been analyzed and holds at least ``rows`` rows, on a connection not in
    a transaction.

    Returns:
        True once nothing is left to do: it has statistics, now or before, or this role may not gather them
        (autovacuum will). False while the table is too small or missing, or another worker analyzes it.
    """
    name = conn.dialect.identifier_preparer.format_table(table)
    with conn.begin():
        state = conn.execute(_STATE, {"name": name}).first()
        if state is None:
            return False
        analyzed, held, owned = state
        if analyzed:
            return True
        if held < rows:
            return False
        if not owned:
            log.info("left %s to autovacuum to analyze: this role does not own it", name)
            return True
        if not conn.execute(_ONE_AT_A_TIME, {"name": name}).scalar_one():
            return False
        # Another ANALYZE or a schema change holding the table only delays this to a later turn.
        conn.exec_driver_sql("SET LOCAL lock_timeout = '1s'")
        conn.exec_driver_sql(f"ANALYZE {name}")
    log.info("analyzed %s, which had no statistics yet at %d rows: its statements are planned again", name, held)
    return True
