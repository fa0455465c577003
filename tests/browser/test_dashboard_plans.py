"""The dashboard's reads use indexes on every backend, on a table of mostly finished jobs: the
overview's counts, the chart, a key's jobs and the next page of the list never read the whole table."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa

import dibs
from dibs.dashboard import reads
from tests.queue.database import QueueDatabase
from tests.queue.support import (
    assert_reads_indexes,
    caught_statements,
    plan_of,
    reads_whole,
    statistics_taken_now,
)

READS: dict[str, Any] = {
    "queue counts": (lambda engine: reads.queue_lines(engine), ["dibs_jobs_claim"]),
    "chart": (lambda engine: reads.throughput(engine), ["dibs_jobs_finished"]),
    "a key's jobs": (lambda engine: reads.job_page(engine, reads.JobFilter(key="k-7"), None), ["dibs_jobs_dedupe"]),
}


def _filled(qdb: QueueDatabase, count: int = 3000) -> None:
    """``count`` jobs that finished two days ago, statistics that say so, and one live job."""
    app = qdb.app()

    @app.task(name="bulk.step")
    def step() -> None: ...

    app.enqueue_many(step, [{}] * count)
    finished = datetime.now(timezone.utc) - timedelta(days=2)
    with qdb.engine.begin() as conn:
        conn.execute(sa.update(dibs.schema.jobs).values(status="succeeded", finished_at=finished))
    app.enqueue(step, dedupe_key="k-7")
    statistics_taken_now(qdb.engine, "dibs_jobs")


@pytest.mark.parametrize("read", list(READS))
def test_a_dashboard_read_uses_its_indexes_not_the_whole_table(qdb: QueueDatabase, read: str) -> None:
    _filled(qdb)
    call, indexes = READS[read]
    statements = caught_statements(qdb.engine, lambda: call(qdb.engine))
    with qdb.engine.connect() as conn:
        plans = [plan_of(conn, statement, parameters) for statement, parameters in statements]
    if qdb.engine.dialect.name == "mysql":
        indexes = [f"{index}_full" if index != "dibs_jobs_dedupe" else index for index in indexes]
    everything = " || ".join(plans)
    for index in indexes:
        assert index in everything, everything
    for plan in plans:
        assert not reads_whole(plan, "dibs_jobs"), plan


def test_a_search_for_text_reads_a_range_of_the_primary_key(qdb: QueueDatabase) -> None:
    _filled(qdb)
    chosen = reads.JobFilter(text="needle")
    statements = caught_statements(qdb.engine, lambda: reads.job_page(qdb.engine, chosen, None, window=100))
    assert_reads_indexes(qdb.engine, statements, "dibs_jobs", [])


def test_the_next_page_of_jobs_starts_from_the_primary_key(qdb: QueueDatabase) -> None:
    _filled(qdb, 500)
    statements = caught_statements(qdb.engine, lambda: reads.job_page(qdb.engine, reads.JobFilter(), 250))
    assert_reads_indexes(qdb.engine, statements, "dibs_jobs", [])


def test_a_jobs_family_is_read_by_the_links_keys(qdb: QueueDatabase) -> None:
    app = qdb.app()

    @app.task(name="bulk.step")
    def step() -> None: ...

    parents = app.enqueue_many(step, [{}] * 2000)
    for first in range(0, 2000, 10):
        app.enqueue(step, after=parents[first : first + 10])
    for table in ("dibs_jobs", "dibs_job_parents"):
        statistics_taken_now(qdb.engine, table)
    statements = caught_statements(qdb.engine, lambda: reads.job_family(qdb.engine, parents[500].id))
    with qdb.engine.connect() as conn:
        plans = [plan_of(conn, statement, parameters) for statement, parameters in statements]
    # One job's links are found by key and then sorted: a sort of its own few (or one fan-out's) rows.
    assert "dibs_job_parents_parent" in " || ".join(plans)
    for plan in plans:
        assert not reads_whole(plan, "dibs_job_parents"), plan
        assert not reads_whole(plan, "dibs_jobs"), plan
