"""A new queue table's first statistics on PostgreSQL, gathered by dibs when autovacuum has not yet.

PostgreSQL plans a statement prepared on a connection once it has run five times, and keeps that plan
until the table's statistics change. Planned while a new jobs table held a handful of rows, a claim or a
completion reads the whole table, which is cheapest then, and goes on doing so as the table grows, until
autovacuum first analyzes it: its naptime is a minute, and a busy queue adds tens of thousands of rows in
that time (measured: at 1,000 jobs a second, 3,600 rows read a statement after a few seconds, and twice
the enqueue-to-start latency). ANALYZE, once the table is big enough for its primary key to be the cheaper
way in, makes every connection plan its statements again; autovacuum keeps the statistics from then on.
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from sqlalchemy.engine import Connection

log = logging.getLogger("dibs.statistics")

#: Rows (live or dead) a never-analyzed table holds before dibs analyzes it: with statistics, PostgreSQL
#: 15 found the jobs of a claim by primary key from about 1,000 rows, and scanned a table of 300.
FIRST_STATISTICS_ROWS = 2_000

_STATE = sa.text(
    "SELECT last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL, n_live_tup + n_dead_tup "
    "FROM pg_stat_all_tables WHERE relid = to_regclass(:name)"
)


def gather_first_statistics(conn: Connection, table: sa.Table, rows: int = FIRST_STATISTICS_ROWS) -> bool:
    """ANALYZE ``table`` if it has never been analyzed and holds at least ``rows`` rows, on a connection not in
    a transaction.

    Returns:
        True once nothing is left to do (it has statistics, now or before, or this role may not gather
        them: PostgreSQL then only warns); False while the table is still too small, or missing.
    """
    name = conn.dialect.identifier_preparer.format_table(table)
    with conn.begin():
        state = conn.execute(_STATE, {"name": name}).first()
        if state is None:
            return False
        analyzed, held = state
        if analyzed:
            return True
        if held < rows:
            return False
        conn.exec_driver_sql(f"ANALYZE {name}")
    # A role that does not own the table is only warned by PostgreSQL; autovacuum then gathers them in time.
    log.info("analyzed %s, which had no statistics yet at %d rows: its statements are planned again", name, held)
    return True
