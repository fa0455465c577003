"""Pausing a periodic schedule: its slots pass without a job, on every worker, and a resume makes up for none
of them; the pause is recorded for a schedule no worker recorded yet, and refused for one nobody knows."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

import dibs
from dibs.queue.periodic import Periodic, stored_slot_after
from dibs.schema import LATEST, MIGRATIONS, current_version, jobs, periodic
from tests.queue.database import QueueDatabase
from tests.queue.support import database_now

HOUR = timedelta(hours=1)
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def _next_slot(engine: Engine, name: str) -> datetime:
    with engine.connect() as conn:
        return _aware(conn.execute(sa.select(periodic.c.next_slot_at).where(periodic.c.name == name)).scalar_one())


def _set_next_slot(engine: Engine, name: str, when: datetime) -> None:
    stored = when if engine.dialect.name == "postgresql" else when.astimezone(timezone.utc).replace(tzinfo=None)
    with engine.begin() as conn:
        conn.execute(sa.update(periodic).where(periodic.c.name == name).values(next_slot_at=stored))


def _job_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar_one())


def _hourly(qdb: QueueDatabase, missed: str = "catch_up") -> dibs.App:
    app = qdb.app()

    @app.periodic(every=HOUR, name="hourly", missed=missed)
    @app.task(name="report")
    def report() -> None: ...

    return app


@pytest.mark.parametrize("missed", ["skip", "catch_up"])
def test_a_paused_schedule_lets_its_slots_pass_and_a_resume_makes_up_for_none(qdb: QueueDatabase, missed: str) -> None:
    app = _hourly(qdb, missed)
    app.sync_periodic()
    app.pause_periodic("hourly")
    assert [(s.name, s.paused) for s in app.periodic_status()] == [("hourly", True)]
    now = database_now(qdb.engine)
    due = EPOCH + (now - EPOCH) // HOUR * HOUR - 5 * HOUR  # six slots came while it was paused
    _set_next_slot(qdb.engine, "hourly", due)

    assert app.enqueue_periodic() == 0
    assert _job_count(qdb.engine) == 0
    moved = _next_slot(qdb.engine, "hourly")
    assert moved > now  # moved on past every slot that came, so none is left to make up for
    (status,) = app.periodic_status()
    assert (status.last_slot_at, status.last_job_id) == (None, None)

    app.resume_periodic("hourly")
    app.resume_periodic("hourly")  # resuming twice is the same as once
    assert [s.paused for s in app.periodic_status()] == [False]
    assert app.enqueue_periodic() == 0  # its next slot has not come
    _set_next_slot(qdb.engine, "hourly", moved - HOUR)  # that slot comes now
    assert app.enqueue_periodic() == 1


@pytest.mark.parametrize("missed", ["skip", "catch_up"])
def test_a_resume_makes_up_for_no_slot_that_passed_while_no_worker_ran(qdb: QueueDatabase, missed: str) -> None:
    """Workers stopped during the pause never moved the schedule on: the resume does, past the slots that came."""
    app = _hourly(qdb, missed)
    app.sync_periodic()
    app.pause_periodic("hourly")
    now = database_now(qdb.engine)
    _set_next_slot(qdb.engine, "hourly", EPOCH + (now - EPOCH) // HOUR * HOUR - 5 * HOUR)
    app.resume_periodic("hourly")
    assert app.enqueue_periodic() == 0
    assert _job_count(qdb.engine) == 0
    assert _next_slot(qdb.engine, "hourly") == EPOCH + ((now - EPOCH) // HOUR + 1) * HOUR


@pytest.mark.parametrize(
    "schedule",
    [{"every": timedelta(seconds=1.5)}, {"every": timedelta(days=36499, microseconds=7)}, {"cron": "*/15 3 * * 1"}],
)
def test_the_slot_a_resume_moves_to_is_the_one_the_schedule_gives(schedule: dict[str, Any]) -> None:
    definition = Periodic(
        name="p", task=dibs.App("sqlite:///never-opened.sqlite").task(name="t")(lambda: None), **schedule
    )
    moment = datetime(2026, 11, 26, 23, 7, 42, 123456, tzinfo=timezone.utc)
    assert stored_slot_after(definition.schedule, moment) == definition.next_after(moment)
    assert stored_slot_after("every nothing", moment) is None


def test_a_worker_enqueues_nothing_for_a_paused_schedule(qdb: QueueDatabase) -> None:
    app = _hourly(qdb)
    app.sync_periodic()
    app.pause_periodic("hourly")
    _set_next_slot(qdb.engine, "hourly", database_now(qdb.engine) - HOUR)
    qdb.drain(app)
    assert _job_count(qdb.engine) == 0
    assert _next_slot(qdb.engine, "hourly") > database_now(qdb.engine)


def test_a_changed_schedule_stays_paused(qdb: QueueDatabase) -> None:
    _hourly(qdb).pause_periodic("hourly")  # registered, not recorded yet: recorded, then paused
    app = qdb.app()

    @app.periodic(every=2 * HOUR, name="hourly")
    @app.task(name="report")
    def report() -> None: ...

    app.sync_periodic()
    (status,) = app.periodic_status()
    assert (status.schedule, status.paused) == ("every 7200s", True)


def test_an_app_with_another_version_of_a_schedule_pauses_it_as_recorded(qdb: QueueDatabase) -> None:
    """The workers that run the recorded version keep it: a pause from an app ahead of them changes nothing else."""
    _hourly(qdb).sync_periodic()
    recorded = _next_slot(qdb.engine, "hourly")
    newer = qdb.app()

    @newer.periodic(every=2 * HOUR, name="hourly")
    @newer.task(name="report")
    def report() -> None: ...

    newer.pause_periodic("hourly")
    newer.resume_periodic("hourly")
    newer.pause_periodic("hourly")
    (status,) = newer.periodic_status()
    assert (status.schedule, status.paused, status.next_slot_at) == ("every 3600s", True, recorded)


def test_pausing_a_schedule_nobody_recorded_or_a_bad_name_is_refused(qdb: QueueDatabase) -> None:
    app = qdb.app()
    with pytest.raises(
        dibs.InvalidArgument, match=r"no periodic job named 'nightly' is recorded.*`dibs periodic list`"
    ):
        app.pause_periodic("nightly")
    with pytest.raises(dibs.InvalidArgument, match="no periodic job named 'nightly' is recorded"):
        app.resume_periodic("nightly")
    with pytest.raises(dibs.InvalidArgument, match="a periodic job's name"):
        app.pause_periodic("")
    assert app.periodic_status() == []


def test_a_version_7_periodic_table_gains_the_paused_column(empty_db: QueueDatabase) -> None:
    """A schedule recorded before pausing existed stays, not paused, and can be paused once upgraded."""
    engine = empty_db.engine
    dibs.migrate(engine, MIGRATIONS[:7])
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE dibs_periodic DROP COLUMN paused"))
        now = datetime.now(timezone.utc).replace(tzinfo=None)
        conn.execute(
            sa.text(
                "INSERT INTO dibs_periodic (name, task, schedule, next_slot_at, updated_at) "
                "VALUES ('hourly', 'report', 'every 3600s', :now, :now)"
            ),
            {"now": now + HOUR},
        )
    assert [step.version for step in dibs.migrate(engine)] == list(range(8, LATEST + 1))
    assert current_version(engine) == LATEST
    app = empty_db.app()
    assert [(s.name, s.paused) for s in app.periodic_status()] == [("hourly", False)]
    app.pause_periodic("hourly")
    assert [s.paused for s in app.periodic_status()] == [True]
