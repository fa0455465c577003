"""Which rows are due, on the database's clock, and in which order a claim takes them: the limit applies after
the due test."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import dibs
from tests.due.sources import Sources
from tests.due.support import HOUR, SLOW_CLOCK_SCHEMA, database_now, storable


def due_ids(scheduler: dibs.DueScheduler, sources: Sources) -> set[int]:
    return {row.id for row in scheduler.due_rows(sources.engine, limit=1000)}


def claimed_ids(scheduler: dibs.DueScheduler, sources: Sources, limit: int = 1000) -> list[int]:
    return [lease.key[0] for lease in scheduler.claim(sources.engine, owner="tester", limit=limit)]


# -- the due test ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("interval", [timedelta(seconds=60), 60, 60.0], ids=["timedelta", "seconds", "float"])
def test_a_constant_interval(sources: Sources, interval: Any) -> None:
    now = sources.now()
    sources.add(
        {"id": 1},  # never run
        {"id": 2, "last_run_at": sources.ago(120, now)},  # overdue
        {"id": 3, "last_run_at": sources.ago(30, now)},  # not due for another 30 s
        {"id": 4, "enabled": False},  # never run, but disabled
        {"id": 5, "enabled": False, "last_run_at": sources.ago(3600, now)},  # overdue, but disabled
        {"id": 6, "last_run_at": sources.ago(61, now)},  # just overdue
        {"id": 7, "last_run_at": sources.ago(55, now)},  # due in 5 s
    )
    scheduler = sources.scheduler(interval=interval)
    assert due_ids(scheduler, sources) == {1, 2, 6}
    assert sorted(claimed_ids(scheduler, sources)) == [1, 2, 6]
    assert due_ids(scheduler, sources) == set()  # all held now
    assert claimed_ids(scheduler, sources) == []


def test_without_an_enabled_column_every_row_may_be_due(sources: Sources) -> None:
    sources.add({"id": 1, "enabled": False}, {"id": 2, "enabled": True, "last_run_at": sources.ago(5)})
    scheduler = dibs.DueScheduler(sources.table, last_run="last_run_at", interval=60)
    assert due_ids(scheduler, sources) == {1}


def test_a_per_row_interval_in_seconds(sources: Sources) -> None:
    now = sources.now()
    sources.add(
        {"id": 1, "every_seconds": 10},  # never run
        {"id": 2, "every_seconds": 60, "last_run_at": sources.ago(100, now)},  # due
        {"id": 3, "every_seconds": 300, "last_run_at": sources.ago(100, now)},  # due in 200 s
        {"id": 4, "every_seconds": 10, "last_run_at": sources.ago(5, now)},  # due in 5 s
        {"id": 5, "every_seconds": 10, "last_run_at": sources.ago(20, now)},  # due
        {"id": 6, "every_seconds": 10, "last_run_at": sources.ago(20, now), "enabled": False},
        {"id": 7, "every_seconds": 3600, "last_run_at": sources.ago(3 * 3600, now)},  # due
    )
    for interval in ("every_seconds", sources.table.c.every_seconds):
        scheduler = sources.scheduler(interval=interval)
        assert due_ids(scheduler, sources) == {1, 2, 5, 7}
    assert sorted(claimed_ids(scheduler, sources)) == [1, 2, 5, 7]
    assert claimed_ids(scheduler, sources) == []


def minute_sources(sources: Sources) -> None:
    """Sources with intervals in minutes: taken for seconds, 3 would be due and 4 and 5 not."""
    now = sources.now()
    sources.add(
        {"id": 1, "every_minutes": 5},  # never run
        {"id": 2, "every_minutes": 5, "last_run_at": sources.ago(10 * 60, now)},  # due
        {"id": 3, "every_minutes": 5, "last_run_at": sources.ago(3 * 60, now)},  # due in 2 minutes
        {"id": 4, "every_minutes": 1, "last_run_at": sources.ago(90, now)},  # due
        {"id": 5, "every_minutes": 1, "last_run_at": sources.ago(30, now)},  # due in 30 s
        {"id": 6, "every_minutes": 1, "last_run_at": sources.ago(90, now), "enabled": False},
        {"id": 7, "every_minutes": 120, "last_run_at": sources.ago(100 * 60, now)},  # due in 20 minutes
    )


def test_a_per_row_interval_in_minutes(sources: Sources) -> None:
    minute_sources(sources)
    scheduler = sources.scheduler(interval="every_minutes", interval_unit="minutes")
    assert due_ids(scheduler, sources) == {1, 2, 4}
    assert sorted(claimed_ids(scheduler, sources)) == [1, 2, 4]
    assert claimed_ids(scheduler, sources) == []


def test_an_sql_expression_in_seconds(sources: Sources) -> None:
    minute_sources(sources)
    scheduler = sources.scheduler(interval=sources.table.c.every_minutes * 60)
    assert due_ids(scheduler, sources) == {1, 2, 4}
    assert sorted(claimed_ids(scheduler, sources)) == [1, 2, 4]
    assert claimed_ids(scheduler, sources) == []


def test_an_sql_expression_may_combine_columns(sources: Sources) -> None:
    now = sources.now()
    sources.add(
        {"id": 1, "every_seconds": 30, "last_run_at": sources.ago(45, now)},  # 30 s: due
        {"id": 2, "every_minutes": 1, "last_run_at": sources.ago(45, now)},  # 60 s: due in 15 s
        {"id": 3, "last_run_at": sources.ago(45, now)},  # neither: the default of 40 s, due
        {"id": 4, "last_run_at": sources.ago(35, now)},  # the default of 40 s: due in 5 s
    )
    table = sources.table.c
    interval = sa.func.coalesce(table.every_seconds, table.every_minutes * 60, 40)
    scheduler = sources.scheduler(interval=interval)
    assert due_ids(scheduler, sources) == {1, 3}
    assert sorted(claimed_ids(scheduler, sources)) == [1, 3]


# -- the database's clock ----------------------------------------------------------------------------------


def test_a_row_becomes_due_when_its_interval_has_passed_on_the_database_clock(sources: Sources) -> None:
    if sources.family == "sqlite":
        pytest.skip("SQLite runs in the application's process: its clock is the application's")
    scheduler = sources.scheduler(interval=2)
    per_row = sources.scheduler(interval="every_seconds")
    asked = time.monotonic()
    now = database_now(sources.engine)
    answered = time.monotonic()
    # Due 1 s from the database's now: between asked + 1 and answered + 1 on this process's clock.
    sources.add({"id": 1, "every_seconds": 2, "last_run_at": sources.ago(1.0, now)})
    assert due_ids(scheduler, sources) == set()
    assert due_ids(per_row, sources) == set()
    assert time.monotonic() < asked + 1.0, "too slow to tell: the row may have become due meanwhile"
    time.sleep(max(0.0, answered + 1.1 - time.monotonic()))
    assert due_ids(scheduler, sources) == {1}
    assert due_ids(per_row, sources) == {1}
    assert claimed_ids(per_row, sources) == [1]


@pytest.fixture
def slow_clock(sources: Sources) -> Iterator[sa.Engine]:
    """An engine whose database clock runs an hour behind the application's (and the server's own)."""
    if sources.family == "sqlite":
        pytest.skip("SQLite runs in the application's process: its clock is the application's")
    engine = sources.new_engine()
    if sources.family == "postgresql":
        with sources.engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE SCHEMA {SLOW_CLOCK_SCHEMA}")
            for name in ("statement_timestamp", "now", "clock_timestamp", "transaction_timestamp"):
                conn.exec_driver_sql(
                    f"CREATE FUNCTION {SLOW_CLOCK_SCHEMA}.{name}() RETURNS timestamptz LANGUAGE sql STABLE "
                    f"AS $$ SELECT pg_catalog.{name}() - interval '1 hour' $$"
                )
        # Named before pg_catalog, the schema's functions shadow the real clock's.
        setting = f"SET search_path = {SLOW_CLOCK_SCHEMA}, pg_catalog, public"
    else:
        # MariaDB's session timestamp: NOW() and UTC_TIMESTAMP() say an hour ago (and stand still).
        setting = "SET timestamp = UNIX_TIMESTAMP(UTC_TIMESTAMP(6)) - 3600"

    @sa.event.listens_for(engine, "connect")
    def _slow(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(setting)
        finally:
            cursor.close()
        dbapi_connection.commit()  # else the pool's rollback undoes PostgreSQL's SET

    for _ in range(2):  # the setting outlives the first checkout
        with engine.connect() as conn:
            lag = database_now(sources.engine) - database_now(conn)
        assert timedelta(minutes=59) < lag < timedelta(minutes=61)
    return engine


def test_the_due_test_reads_the_database_clock_not_the_applications(sources: Sources, slow_clock: sa.Engine) -> None:
    now = sources.now()  # the real time
    sources.add(
        {"id": 1, "every_minutes": 5, "last_run_at": sources.ago(10 * 60, now)},  # due by the real clock only
        {"id": 2, "every_minutes": 5, "last_run_at": sources.ago(90 * 60, now)},  # due by both
        {"id": 3, "every_minutes": 5},  # never run
    )
    constant = sources.scheduler(interval=timedelta(minutes=5))
    per_row = sources.scheduler(interval="every_minutes", interval_unit="minutes")
    for scheduler in (constant, per_row):
        assert due_ids(scheduler, sources) == {1, 2, 3}  # the real clock
        assert {row.id for row in scheduler.due_rows(slow_clock)} == {2, 3}
    assert sorted(lease.key[0] for lease in per_row.claim(slow_clock, owner="slow", limit=10)) == [2, 3]
    assert constant.claim(slow_clock, owner="slow", limit=10) == []


def test_done_stamps_the_database_clock(sources: Sources, slow_clock: sa.Engine) -> None:
    sources.add({"id": 1})
    scheduler = sources.scheduler(interval=HOUR)
    leases = scheduler.claim(slow_clock, owner="slow", limit=1)
    assert scheduler.complete(slow_clock, leases) == []
    last_run = sources.last_run(1)
    assert last_run is not None
    behind = sources.now() - last_run
    assert timedelta(minutes=59) < behind < timedelta(minutes=61)


# -- the limit, after the due test, and the order ----------------------------------------------------------


def test_the_limit_applies_after_the_due_test_in_the_documented_order(sources: Sources) -> None:
    now = sources.now()
    # 90 rows that are not due come first by id and by priority: a limit taken before the due test would
    # find them, and nothing else.
    sources.add(
        *[{"id": n, "priority": 1000, "last_run_at": sources.ago(10, now)} for n in range(1, 61)],
        *[{"id": n, "priority": 1000, "enabled": False} for n in range(61, 91)],
    )
    hours = 3600
    sources.add(
        {"id": 97, "priority": 5, "last_run_at": sources.ago(2 * hours, now)},
        {"id": 100, "priority": 1},
        {"id": 92, "priority": 1, "last_run_at": sources.ago(5 * hours, now)},
        {"id": 95, "priority": 1, "last_run_at": sources.ago(3 * hours, now)},
        {"id": 93, "priority": 0},
        {"id": 99, "priority": 0, "last_run_at": sources.ago(6 * hours, now)},
        {"id": 91, "priority": 0, "last_run_at": sources.ago(4 * hours, now)},
        {"id": 96, "priority": 0, "last_run_at": sources.ago(2 * hours, now)},
        {"id": 94, "priority": 0, "last_run_at": sources.ago(1.5 * hours, now)},
        {"id": 98, "priority": 0, "last_run_at": sources.ago(1.1 * hours, now)},
    )
    order = [97, 100, 92, 95, 93, 99, 91, 96, 94, 98]
    scheduler = sources.scheduler(interval=HOUR, priority="priority")

    assert [row.id for row in scheduler.due_rows(sources.engine, limit=3)] == order[:3]
    assert [row.id for row in scheduler.due_rows(sources.engine, limit=100)] == order
    batches = [scheduler.claim(sources.engine, owner="tester", limit=3) for _ in range(5)]
    taken = [[lease.key[0] for lease in batch] for batch in batches]
    assert taken == [order[0:3], order[3:6], order[6:9], order[9:], []]

    # Given back, all ten are due again, and a claim of ten takes exactly them.
    assert scheduler.release(sources.engine, [lease for batch in batches for lease in batch]) == []
    assert claimed_ids(scheduler, sources, limit=10) == order
    assert claimed_ids(scheduler, sources, limit=10) == []


def test_without_priority_never_run_rows_come_first_then_the_oldest(sources: Sources) -> None:
    now = sources.now()
    sources.add(
        {"id": 1, "last_run_at": sources.ago(7200, now), "priority": 100},
        {"id": 2, "last_run_at": sources.ago(9000, now)},
        {"id": 3},
        {"id": 4, "last_run_at": sources.ago(8000, now)},
    )
    scheduler = sources.scheduler(interval=HOUR)
    assert claimed_ids(scheduler, sources, limit=2) == [3, 2]
    assert claimed_ids(scheduler, sources, limit=2) == [4, 1]


def test_rows_without_a_priority_go_after_those_with_one_on_every_backend(sources: Sources) -> None:
    """A nullable priority column: the same rows must be taken in the same order on every database."""
    sources.add({"id": 1, "priority": None}, {"id": 2, "priority": 5}, {"id": 3, "priority": 0})
    scheduler = sources.scheduler(interval=HOUR, priority="priority")
    assert claimed_ids(scheduler, sources, limit=3) == [2, 3, 1]


def test_storable_values_round_trip(sources: Sources) -> None:
    """The helper the other tests lean on: a time written is the time read back, to the microsecond."""
    now = sources.now()
    sources.add({"id": 1, "last_run_at": storable(sources.engine, now)})
    assert sources.last_run(1) == now


@pytest.mark.parametrize("due_url", ["sqlite"], indirect=True)  # the same on every backend
@pytest.mark.parametrize("kind", ["constant", "expression"])
def test_an_interval_unit_given_with_a_constant_or_an_expression_is_not_ignored(sources: Sources, kind: str) -> None:
    """interval_unit='minutes' applies to interval columns only; given with a constant or an expression it
    must be honoured or refused, not dropped: interval=5, interval_unit='minutes' meaning 5 seconds runs every
    source 60 times too often."""
    sources.add({"id": 1, "every_seconds": 5, "last_run_at": sources.ago(120)})  # 2 minutes ago
    interval = 5 if kind == "constant" else sources.table.c.every_seconds * 1
    try:
        scheduler = sources.scheduler(interval=interval, interval_unit="minutes")
    except dibs.InvalidArgument:
        return
    assert due_ids(scheduler, sources) == set(), "due every 5 minutes, run 2 minutes ago, yet due"
