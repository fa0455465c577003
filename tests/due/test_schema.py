"""The scheduler's columns: added to an existing table once, the rows there ready at once; and the arguments
the scheduler refuses, with errors that say what to do."""

from __future__ import annotations

import asyncio
from datetime import timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa

import dibs
from dibs.schema import aware
from tests.due.sources import Sources
from tests.due.support import PLAIN_SOURCES, database_now, sources_table, storable

SCHEDULER_COLUMNS = ["lease_status", "lease_owner", "lease_expires_at", "lease_token", "run_count", "last_error"]


def plain_sources(engine: sa.Engine) -> sa.Table:
    """The user's table as it was before the scheduler: created, with four sources in it."""
    table = sources_table(sa.MetaData(), PLAIN_SOURCES, due=False)
    table.create(engine)
    now = database_now(engine)
    hours_ago, seconds_ago = (storable(engine, now - timedelta(**ago)) for ago in ({"hours": 2}, {"seconds": 10}))
    with engine.begin() as conn:
        conn.execute(
            table.insert(),
            [
                {"id": 1, "url": "https://a.example/feed", "last_run_at": None, "enabled": True},
                {"id": 2, "url": "https://b.example/feed", "last_run_at": hours_ago, "enabled": True},
                {"id": 3, "url": "https://c.example/feed", "last_run_at": seconds_ago, "enabled": True},
                {"id": 4, "url": "https://d.example/feed", "last_run_at": None, "enabled": False},
            ],
        )
    return table


def test_add_due_columns_to_a_table_with_rows(due_url: sa.URL) -> None:
    engine = dibs.create_engine(due_url)
    try:
        table = plain_sources(engine)
        with pytest.raises(dibs.InvalidArgument, match=r"dibs\.add_due_columns\(engine, table\)"):
            dibs.DueScheduler(table, last_run="last_run_at", interval=60)

        assert dibs.add_due_columns(engine, table) == SCHEDULER_COLUMNS
        assert [column.name for column in table.columns][-6:] == SCHEDULER_COLUMNS
        in_database = [column["name"] for column in sa.inspect(engine).get_columns(PLAIN_SOURCES)]
        assert in_database[-6:] == SCHEDULER_COLUMNS
        assert dibs.add_due_columns(engine, table) == []  # once only

        # At the next start the Table is defined anew, without them: nothing to add, the Table gets them.
        again = sources_table(sa.MetaData(), PLAIN_SOURCES, due=False)
        assert dibs.add_due_columns(engine, again) == []
        assert [column.name for column in again.columns][-6:] == SCHEDULER_COLUMNS
        assert [column["name"] for column in sa.inspect(engine).get_columns(PLAIN_SOURCES)] == in_database

        with engine.connect() as conn:
            rows = list(conn.execute(sa.select(again).order_by(again.c.id)))
        assert [row.id for row in rows] == [1, 2, 3, 4]
        for row in rows:
            assert (row.lease_status, row.lease_owner, row.lease_expires_at) == ("idle", None, None)
            assert (row.lease_token, row.run_count, row.last_error) == (0, 0, None)

        scheduler = dibs.DueScheduler(again, last_run="last_run_at", interval=60, enabled="enabled")
        seen: list[int] = []
        stats = scheduler.run(engine, lambda row: seen.append(row.id))
        assert sorted(seen) == [1, 2]  # 3 ran 10 s ago, 4 is disabled
        assert (stats.claimed, stats.succeeded) == (2, 2)
        assert scheduler.run(engine, lambda row: seen.append(row.id)).claimed == 0
    finally:
        engine.dispose()


def test_add_due_columns_under_other_names(due_url: sa.URL) -> None:
    engine = dibs.create_engine(due_url)
    try:
        table = plain_sources(engine)
        names = {"status": "fetch_state", "runs": "fetches", "last_error": "fetch_error"}
        added = dibs.add_due_columns(engine, table, **names)
        assert added == ["fetch_state", "lease_owner", "lease_expires_at", "lease_token", "fetches", "fetch_error"]
        with pytest.raises(dibs.InvalidArgument, match="add_due_columns"):
            dibs.DueScheduler(table, last_run="last_run_at", interval=60)  # the default names are not there
        scheduler = dibs.DueScheduler(table, last_run="last_run_at", interval=60, enabled="enabled", **names)
        leases = scheduler.claim(engine, owner="tester", limit=10)
        assert sorted(lease.key[0] for lease in leases) == [1, 2]
        assert scheduler.fail(engine, leases[:1], "OSError: gone") == []
        assert scheduler.complete(engine, leases[1:]) == []
        with engine.connect() as conn:
            rows = {row.id: row for row in conn.execute(sa.select(table))}
        failed, done = leases[0].key[0], leases[1].key[0]
        outcome = {key: (rows[key].fetch_state, rows[key].fetches, rows[key].fetch_error) for key in (failed, done)}
        assert outcome == {failed: ("idle", 1, "OSError: gone"), done: ("idle", 1, None)}
        with pytest.raises(dibs.InvalidArgument, match="unknown scheduler column"):
            dibs.add_due_columns(engine, table, state="x")
    finally:
        engine.dispose()


def test_due_columns_make_a_new_table(due_url: sa.URL) -> None:
    engine = dibs.create_engine(due_url)
    try:
        table = sources_table(sa.MetaData(), PLAIN_SOURCES)  # with dibs.due_columns()
        table.create(engine)
        assert dibs.add_due_columns(engine, table) == []
        with engine.begin() as conn:
            conn.execute(table.insert(), [{"id": 1}])
        scheduler = dibs.DueScheduler(table, interval=timedelta(minutes=1))
        (lease,) = scheduler.claim(engine, owner="tester", limit=5)
        assert (lease.row.lease_status, lease.row.lease_owner, lease.row.run_count) == ("running", "tester", 1)
        with pytest.raises(dibs.InvalidArgument, match="unknown scheduler column"):
            dibs.due_columns(statuss="x")
    finally:
        engine.dispose()


# -- arguments ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"interval": -1},
        {"interval": 0},
        {"interval": timedelta(0)},
        {"interval": timedelta(seconds=-5)},
        {"interval": True},
        {"interval": "nonexistent"},
        {"interval": sa.Column("every_seconds", sa.Integer)},  # of no table of ours
        {"interval": object()},
        {"interval": "every_minutes", "interval_unit": "hours"},
        {"interval": 60, "interval_unit": "second"},
        {"interval": 60, "lease": 0},
        {"interval": 60, "lease": timedelta(seconds=-1)},
        {"interval": 60, "retry_after": -1},
        {"interval": 60, "last_run": "last_run"},
        {"interval": 60, "enabled": "is_enabled"},
        {"interval": 60, "priority": "prio"},
        {"interval": 60, "lease_state": "lease_status"},
    ],
    ids=repr,
)
def test_bad_arguments_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(dibs.InvalidArgument):
        dibs.DueScheduler(sources_table(), **{"last_run": "last_run_at", **options})


def test_a_table_without_the_scheduler_columns_is_refused_with_what_to_run() -> None:
    table = sources_table(due=False)
    with pytest.raises(dibs.InvalidArgument) as refused:
        dibs.DueScheduler(table, last_run="last_run_at", interval=60)
    assert "dibs.add_due_columns(engine, table)" in str(refused.value)
    assert table.name in str(refused.value)


def test_a_table_without_a_primary_key_is_refused() -> None:
    table = sa.Table("no_key", sa.MetaData(), sa.Column("last_run_at", dibs.Timestamp), *dibs.due_columns())
    with pytest.raises(dibs.InvalidArgument, match="primary key"):
        dibs.DueScheduler(table, last_run="last_run_at", interval=60)


@pytest.mark.parametrize("due_url", ["sqlite"], indirect=True)  # refused before the database is asked
def test_bad_run_arguments_are_refused_and_nothing_is_claimed(sources: Sources) -> None:
    sources.add({"id": 1})
    scheduler = sources.scheduler(interval=60)

    async def handler(row: Any) -> None: ...

    with pytest.raises(dibs.InvalidArgument, match="arun"):
        scheduler.run(sources.engine, handler)
    for options in ({"max_sources": 0}, {"max_sources": -1}, {"concurrency": 0}, {"max_sources": 2.5}):
        with pytest.raises(dibs.InvalidArgument):
            scheduler.run(sources.engine, lambda row: None, **options)
        with pytest.raises(dibs.InvalidArgument):
            asyncio.run(scheduler.arun(sources.engine, handler, **options))
    with pytest.raises(dibs.InvalidArgument):
        scheduler.claim(sources.engine, owner="", limit=1)
    with pytest.raises(dibs.InvalidArgument):
        scheduler.claim(sources.engine, owner="tester", limit="3")  # type: ignore[arg-type]
    row = sources.row(1)
    assert (row.lease_status, row.lease_token, row.run_count) == ("idle", 0, 0)


def test_a_last_run_in_any_time_zone_is_stored_as_the_same_instant(sources: Sources) -> None:
    """An aware time in UTC-5 ten minutes ago is not due under an hourly interval on any database: where the
    column has no time zone it must be stored converted to UTC, not with its offset dropped."""
    eastern = timezone(timedelta(hours=-5))
    ten_minutes_ago = (sources.now() - timedelta(minutes=10)).astimezone(eastern)
    sources.add({"id": 1, "last_run_at": ten_minutes_ago}, {"id": 2, "last_run_at": sources.ago(7200)})
    scheduler = sources.scheduler(interval=3600)
    assert [row.id for row in scheduler.due_rows(sources.engine)] == [2]
    stored = aware(sources.row(1).last_run_at)
    assert stored == ten_minutes_ago
    with sources.engine.connect() as conn:  # a comparison with an aware time means the same instant too
        table = sources.table
        found = conn.execute(sa.select(table.c.id).where(table.c.last_run_at >= ten_minutes_ago)).scalars().all()
    assert found == [1]
