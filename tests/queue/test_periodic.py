"""Periodic jobs: one job per slot however many schedulers run, missed slots skipped or caught up, slots
on the database clock, schedules synced and checked, and their jobs run and shown by `dibs status`."""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

import dibs
import dibs.dialects.values
import dibs.queue.periodic
from dibs.queue.periodic import MAX_CATCH_UP, Periodic
from dibs.schema import jobs, periodic
from tests.helpers import wait_until
from tests.queue.database import QueueDatabase
from tests.queue.periodic_process import TICKS, add_ticks
from tests.queue.support import database_now

ROOT = Path(__file__).resolve().parents[2]
DIBS = str(Path(sys.executable).with_name("dibs"))
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
UTC = timezone.utc
SECOND = timedelta(seconds=1)
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
#: Every minute and every hour written out as a list: a cron expression too long to store.
LISTED_MINUTES, LISTED_HOURS = ",".join(map(str, range(60))), ",".join(map(str, range(24)))


# -- helpers -----------------------------------------------------------------------------------------


def floor_slot(moment: datetime, step: timedelta) -> datetime:
    """The latest slot of an ``every=step`` schedule at or before ``moment`` (slots count from the epoch)."""
    return EPOCH + (moment - EPOCH) // step * step


def aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def slot_of(dedupe_key: str) -> datetime:
    """The slot a periodic job's dedupe key (``periodic:<name>:<%Y%m%dT%H%M%SZ>``) names."""
    return datetime.strptime(dedupe_key.rsplit(":", 1)[1], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)


def periodic_jobs(engine: Engine, name: str) -> list[tuple[datetime, sa.Row[Any]]]:
    """(slot, row) of the live jobs of schedule ``name``, in the order they were enqueued."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(jobs).where(jobs.c.dedupe_key.like(f"periodic:{name}:%")).order_by(jobs.c.id)
        ).all()
    return [(slot_of(row.dedupe_key), row) for row in rows]


def all_jobs(engine: Engine) -> list[sa.Row[Any]]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(jobs).order_by(jobs.c.id)))


def schedule_row(engine: Engine, name: str) -> sa.Row[Any]:
    with engine.connect() as conn:
        return conn.execute(sa.select(periodic).where(periodic.c.name == name)).one()


def next_slot(engine: Engine, name: str) -> datetime:
    return aware(schedule_row(engine, name).next_slot_at)


def set_next_slot(engine: Engine, name: str, when: datetime) -> None:
    """Move a schedule's next slot (aware) by hand, as the database column stores it."""
    stored = when if engine.dialect.name == "postgresql" else when.astimezone(UTC).replace(tzinfo=None)
    with engine.begin() as conn:
        assert conn.execute(sa.update(periodic).where(periodic.c.name == name).values(next_slot_at=stored)).rowcount
    assert next_slot(engine, name) == when


def standalone_app() -> dibs.App:
    """An App whose database is never touched (for checks that need no database)."""
    return dibs.App("sqlite:///never-opened.sqlite")


# -- 1. exactly once per slot ------------------------------------------------------------------------


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts; killed at the end if still running."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()


def start_process(qdb: QueueDatabase, name: str, log: Path) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "tests.queue.periodic_process", qdb.url.render_as_string(False), name]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with log.open("w") as output:
        return subprocess.Popen(command, cwd=ROOT, env=environment, stdout=output, stderr=subprocess.STDOUT, text=True)


def test_several_schedulers_enqueue_exactly_one_job_per_slot(
    qdb: QueueDatabase, processes: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    before = database_now(qdb.engine)
    # On the servers, three worker processes with fast upkeep schedule the same job too.
    logs: list[Path] = []
    if qdb.family != "sqlite":
        for n in range(3):
            logs.append(tmp_path / f"process-{n}.log")
            processes.append(start_process(qdb, f"process-{n}", logs[-1]))
        wait_until(
            lambda: all("ready" in log.read_text() for log in logs) or any(p.poll() is not None for p in processes),
            timeout=30,
            what="the worker processes to start",
        )
        assert all(process.poll() is None for process in processes), [log.read_text() for log in logs]

    # Four apps calling enqueue_periodic in a loop, and two thread workers doing it in their upkeep.
    schedulers = [add_ticks(qdb.app(), f"thread-{n}") for n in range(4)]
    workers = [qdb.start(add_ticks(qdb.app(), f"worker-{n}"), queues=["default"]) for n in range(2)]
    stop = threading.Event()
    errors: list[BaseException] = []
    synced: list[dibs.App] = []

    def schedule(app: dibs.App) -> None:
        try:
            app.sync_periodic()
            synced.append(app)
            while not stop.is_set():
                app.enqueue_periodic()
                time.sleep(0.01)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=schedule, args=(app,), daemon=True) for app in schedulers]
    for thread in threads:
        thread.start()
    wait_until(lambda: len(synced) == len(threads) or errors, timeout=15, what="the scheduler threads to sync")
    started = database_now(qdb.engine)  # from here on, slots fire
    time.sleep(3.5)
    stopping = database_now(qdb.engine)
    stop.set()
    for thread in threads:
        thread.join(15)
        assert not thread.is_alive(), "a scheduler thread did not stop"
    for running in workers:
        running.stop()
        assert running.error is None, running.error
    for process in processes:
        assert process.poll() is None, "a worker process died while scheduling"
        process.terminate()
    for process, log in zip(processes, logs, strict=True):
        assert process.wait(15) == 0, log.read_text()
        output = log.read_text()
        assert "Traceback" not in output, output
        assert "upkeep failed" not in output, output
    after = database_now(qdb.engine)
    assert not errors, errors

    fired = periodic_jobs(qdb.engine, TICKS)
    slots = [slot for slot, _ in fired]
    per_slot = collections.Counter(slots)
    assert per_slot, "no job was enqueued"
    assert max(per_slot.values()) == 1, f"slots enqueued more than once: {per_slot}"
    assert len(all_jobs(qdb.engine)) == len(fired), "jobs without a periodic dedupe key"
    ordered = sorted(slots)
    assert all(b - a == SECOND for a, b in itertools.pairwise(ordered)), f"a gap in {ordered}"
    # Every slot lies on the one-second grid, within the run, and every slot that passed while the
    # schedulers ran is there (the first no later than the first after the thread schedulers started).
    assert all(slot.microsecond == 0 for slot in ordered)
    assert before < ordered[0] <= floor_slot(started, SECOND) + SECOND
    assert floor_slot(stopping, SECOND) - SECOND <= ordered[-1] <= after
    assert len(fired) == (ordered[-1] - ordered[0]) // SECOND + 1
    enqueued_by = {json.loads(row.args)["by"] for _, row in fired}
    possible = {f"thread-{n}" for n in range(4)} | {"worker-0", "worker-1"} | {f"process-{n}" for n in range(3)}
    assert enqueued_by <= possible
    row = schedule_row(qdb.engine, TICKS)
    assert aware(row.last_slot_at) == ordered[-1]
    assert row.last_job_id == max(job.id for _, job in fired)
    assert aware(row.next_slot_at) == ordered[-1] + SECOND


# -- 2. missed slots ---------------------------------------------------------------------------------


def hourly(qdb: QueueDatabase, missed: str) -> dibs.App:
    app = qdb.app()

    @app.periodic(every=HOUR, name="hourly", missed=missed)
    @app.task(name="report")
    def report() -> None: ...

    app.sync_periodic()
    return app


@pytest.mark.parametrize("missed", ["skip", "catch_up"])
def test_missed_slots_are_skipped_to_the_latest_or_caught_up_oldest_first(qdb: QueueDatabase, missed: str) -> None:
    app = hourly(qdb, missed)
    began = database_now(qdb.engine)
    first = floor_slot(began, HOUR) - 9 * HOUR  # ten slots passed while no worker ran
    set_next_slot(qdb.engine, "hourly", first)

    enqueued = app.enqueue_periodic()
    ended = database_now(qdb.engine)

    row = schedule_row(qdb.engine, "hourly")
    latest = aware(row.last_slot_at)
    assert latest in {floor_slot(began, HOUR), floor_slot(ended, HOUR)}
    if missed == "catch_up":
        expected = [first + n * HOUR for n in range((latest - first) // HOUR + 1)]
        assert len(expected) >= 10
    else:
        expected = [latest]
    fired = periodic_jobs(qdb.engine, "hourly")
    assert [slot for slot, _ in fired] == expected  # in id order: oldest first
    assert enqueued == len(expected) == len(all_jobs(qdb.engine))
    assert all(job.status == "queued" and job.task == "report" for _, job in fired)
    assert row.last_job_id == fired[-1][1].id
    # The schedule moved on to the first slot after the database's now.
    assert aware(row.next_slot_at) == latest + HOUR
    assert began < aware(row.next_slot_at)
    assert aware(row.next_slot_at) - HOUR <= ended
    # Nothing more is due.
    assert app.enqueue_periodic() == 0
    assert len(all_jobs(qdb.engine)) == len(expected)


def test_each_missed_slot_of_a_schedule_with_a_long_name_gets_a_job_of_its_own(qdb: QueueDatabase) -> None:
    """A name as long as names go leaves no room for the slot in ``periodic:<name>:<slot>``: the key holds
    the name's digest instead, or every slot's job would share one key and all but one be lost."""
    app = qdb.app()
    name = "n" * 200

    @app.periodic(every=HOUR, name=name, missed="catch_up")
    @app.task(name="report")
    def report() -> None: ...

    app.sync_periodic()
    set_next_slot(qdb.engine, name, next_slot(qdb.engine, name) - 5 * HOUR)  # five slots came
    enqueued = app.enqueue_periodic()
    keys = [job.dedupe_key for job in all_jobs(qdb.engine)]
    assert enqueued == len(keys) == len(set(keys)) >= 5
    assert [slot_of(key) for key in keys] == sorted(slot_of(key) for key in keys)
    assert all(len(key) <= 200 for key in keys)


@pytest.mark.parametrize("missed", ["skip", "catch_up"])
@pytest.mark.parametrize(
    ("schedule", "step", "gap"),
    [
        ({"every": SECOND}, SECOND, timedelta(days=30)),  # 2.6 million slots ago
        ({"cron": "* * * * *"}, MINUTE, timedelta(days=3)),  # 4,320 slots ago
    ],
    ids=["every-1s", "cron-minutely"],
)
def test_catching_up_stops_at_the_cap_with_the_latest_slots(
    qdb: QueueDatabase, missed: str, schedule: dict[str, Any], step: timedelta, gap: timedelta
) -> None:
    app = qdb.app()

    @app.periodic(**schedule, name="often", missed=missed)
    @app.task(name="often", queue="idle")
    def often() -> None: ...

    app.sync_periodic()
    began = database_now(qdb.engine)
    set_next_slot(qdb.engine, "often", floor_slot(began, step) - gap)

    enqueued = app.enqueue_periodic()
    ended = database_now(qdb.engine)

    row = schedule_row(qdb.engine, "often")
    latest = aware(row.last_slot_at)
    assert floor_slot(began, step) <= latest <= floor_slot(ended, step)
    slots = [slot for slot, _ in periodic_jobs(qdb.engine, "often")]
    expected = [latest - n * step for n in reversed(range(MAX_CATCH_UP))] if missed == "catch_up" else [latest]
    assert slots == expected
    assert enqueued == len(expected) == len(all_jobs(qdb.engine))
    assert aware(row.next_slot_at) == latest + step
    assert aware(row.next_slot_at) > began


# -- 3. syncing schedules, options, cron -------------------------------------------------------------


def nightly_report() -> None:
    """A task function as an application module defines one."""


def test_a_new_schedule_starts_at_its_next_slot_and_a_restart_keeps_a_due_slot(qdb: QueueDatabase) -> None:
    app = qdb.app()
    report = app.periodic(every=HOUR)(nightly_report)  # a plain function: registered as a task, named after it
    assert report.name == "tests.queue.test_periodic.nightly_report"
    assert app.tasks[report.name] is report

    assert app.periodic_status() == []
    began = database_now(qdb.engine)
    app.sync_periodic()
    ended = database_now(qdb.engine)
    (status,) = app.periodic_status()
    assert status.name == status.task == report.name
    assert status.schedule == "every 3600s"
    assert status.next_slot_at in {floor_slot(began, HOUR) + HOUR, floor_slot(ended, HOUR) + HOUR}
    assert status.last_slot_at is None
    assert status.last_job_id is None
    # No job for the slots before it was first seen.
    assert app.enqueue_periodic() == 0
    assert all_jobs(qdb.engine) == []

    # A worker starting again with the same schedule leaves a due slot due.
    due = status.next_slot_at - 3 * HOUR
    set_next_slot(qdb.engine, report.name, due)
    restarted = qdb.app()
    restarted.periodic(every=HOUR)(nightly_report)
    restarted.sync_periodic()
    assert next_slot(qdb.engine, report.name) == due
    assert restarted.enqueue_periodic() == 1
    ((slot, job),) = periodic_jobs(qdb.engine, report.name)
    assert slot == floor_slot(database_now(qdb.engine), HOUR)
    assert job.task == report.name


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (timedelta(seconds=2), timedelta(seconds=5)),
        (timedelta(days=30), timedelta(days=30, seconds=1)),
    ],
    ids=["2s-to-5s", "30d-to-30d1s"],
)
def test_a_changed_schedule_is_synced_again_from_its_next_slot(
    qdb: QueueDatabase, old: timedelta, new: timedelta
) -> None:
    before = qdb.app()
    before.periodic(every=old, name="changing")(before.task(name="change")(lambda: None))
    before.sync_periodic()
    old_schedule = schedule_row(qdb.engine, "changing").schedule
    set_next_slot(qdb.engine, "changing", floor_slot(database_now(qdb.engine), old) - old)

    after = qdb.app()
    after.periodic(every=new, name="changing")(after.task(name="change")(lambda: None))
    began = database_now(qdb.engine)
    after.sync_periodic()
    ended = database_now(qdb.engine)
    row = schedule_row(qdb.engine, "changing")
    assert row.schedule != old_schedule, f"{old} and {new} are both stored as {old_schedule!r}"
    assert aware(row.next_slot_at) in {floor_slot(began, new) + new, floor_slot(ended, new) + new}

    # While both versions run, the old one leaves the schedule to the new one.
    set_next_slot(qdb.engine, "changing", floor_slot(database_now(qdb.engine), new))
    assert before.enqueue_periodic() == 0
    assert after.enqueue_periodic() == 1
    ((slot, _),) = periodic_jobs(qdb.engine, "changing")
    assert (slot - EPOCH) % new == timedelta(0)


def test_the_jobs_of_a_schedule_have_its_arguments_and_options_and_run(qdb: QueueDatabase) -> None:
    app = qdb.app(queues=["reports"])
    seen: list[dict[str, Any]] = []

    @app.periodic(
        every=HOUR,
        name="summary",
        args={"region": "eu", "top": 3},
        queue="reports",
        priority=7,
        max_attempts=2,
        tag="v2",
    )
    @app.task(name="summarize")
    def summarize(region: str, top: int, context: dibs.JobContext) -> None:
        seen.append({"region": region, "top": top, "job": context.job_id})

    app.sync_periodic()
    set_next_slot(qdb.engine, "summary", next_slot(qdb.engine, "summary") - HOUR)
    assert app.enqueue_periodic() == 1
    ((_, job),) = periodic_jobs(qdb.engine, "summary")
    assert (job.task, job.queue, job.priority, job.max_attempts, job.tag) == (summarize.name, "reports", 7, 2, "v2")
    assert json.loads(job.args) == {"region": "eu", "top": 3}
    # The job runs (a burst worker for the tag and queue drains it) and its dedupe key is let go.
    stats = qdb.drain(app, queues=["reports"], tags=["v2"])
    assert stats.succeeded == 1
    assert seen == [{"region": "eu", "top": 3, "job": job.id}]
    assert app.get(job.id).status == "succeeded"
    assert periodic_jobs(qdb.engine, "summary") == []
    assert schedule_row(qdb.engine, "summary").last_job_id == job.id


@pytest.mark.parametrize(
    ("cron", "after", "expected"),
    [
        ("*/15 * * * *", datetime(2026, 11, 21, 22, 7, tzinfo=UTC), datetime(2026, 11, 21, 22, 15, tzinfo=UTC)),
        ("*/15 * * * *", datetime(2026, 11, 21, 22, 15, tzinfo=UTC), datetime(2026, 11, 21, 22, 30, tzinfo=UTC)),
        ("*/15 * * * *", datetime(2026, 12, 31, 23, 59, 30, tzinfo=UTC), datetime(2027, 1, 1, 0, 0, tzinfo=UTC)),
        # 2026-11-18 is a Wednesday: the next Monday is the 23rd.
        ("0 3 * * 1", datetime(2026, 11, 18, 10, 0, tzinfo=UTC), datetime(2026, 11, 23, 3, 0, tzinfo=UTC)),
        ("0 3 * * 1", datetime(2026, 11, 23, 3, 0, tzinfo=UTC), datetime(2026, 11, 30, 3, 0, tzinfo=UTC)),
        ("0 3 * * 1", datetime(2026, 11, 23, 2, 59, 59, 999999, tzinfo=UTC), datetime(2026, 11, 23, 3, 0, tzinfo=UTC)),
        # Read in UTC whatever the time zone of the moment: 01:30 at +02:00 is 23:30 UTC the day before.
        (
            "0 0 * * *",
            datetime(2026, 1, 1, 1, 30, tzinfo=timezone(timedelta(hours=2))),
            datetime(2026, 1, 1, 0, 0, tzinfo=UTC),
        ),
        ("30 12 1 * *", datetime(2026, 2, 1, 12, 30, tzinfo=UTC), datetime(2026, 3, 1, 12, 30, tzinfo=UTC)),
    ],
)
def test_cron_slots_are_the_next_matching_minute_in_utc(cron: str, after: datetime, expected: datetime) -> None:
    definition = Periodic(name="cron", task=standalone_app().task(name="task")(lambda: None), cron=cron)
    assert definition.next_after(after) == expected
    assert definition.next_after(after).utcoffset() == timedelta(0)
    assert definition.schedule == f"cron {cron}"


@pytest.mark.parametrize(
    ("every", "after", "expected"),
    [
        (SECOND, datetime(2026, 11, 21, 22, 7, 3, tzinfo=UTC), datetime(2026, 11, 21, 22, 7, 4, tzinfo=UTC)),
        (SECOND, datetime(2026, 11, 21, 22, 7, 3, 999999, tzinfo=UTC), datetime(2026, 11, 21, 22, 7, 4, tzinfo=UTC)),
        (timedelta(minutes=15), datetime(2026, 11, 21, 22, 7, tzinfo=UTC), datetime(2026, 11, 21, 22, 15, tzinfo=UTC)),
        (timedelta(minutes=15), datetime(2026, 11, 21, 22, 15, tzinfo=UTC), datetime(2026, 11, 21, 22, 30, tzinfo=UTC)),
        # 7 s slots count from the epoch, not from the minute: 22:07:00 is 1763762820 s, 1 s past a multiple of 7.
        (timedelta(seconds=7), datetime(2025, 11, 21, 22, 7, tzinfo=UTC), datetime(2025, 11, 21, 22, 7, 6, tzinfo=UTC)),
        (
            timedelta(days=1),
            datetime(2026, 3, 5, 1, 0, tzinfo=timezone(timedelta(hours=5))),
            datetime(2026, 3, 5, tzinfo=UTC),
        ),
    ],
)
def test_every_slots_are_whole_multiples_since_the_epoch(every: timedelta, after: datetime, expected: datetime) -> None:
    definition = Periodic(name="every", task=standalone_app().task(name="task")(lambda: None), every=every)
    assert (expected - EPOCH) % every == timedelta(0)
    assert definition.next_after(after) == expected
    assert definition.schedule == f"every {every // SECOND}s"  # whole seconds here


@pytest.mark.parametrize(
    "every",
    [SECOND, timedelta(seconds=7), timedelta(seconds=1, microseconds=1), timedelta(seconds=7, microseconds=333333)],
    ids=["1s", "7s", "1.000001s", "7.333333s"],
)
def test_each_slot_of_an_every_schedule_is_followed_by_the_next(every: timedelta) -> None:
    """next_after() is strictly after its moment, also when the moment is a slot: each slot is followed by the
    one an interval later (the upkeep moves a schedule on with next_after(now), and now can be a slot)."""
    definition = Periodic(name="every", task=standalone_app().task(name="task")(lambda: None), every=every)
    slot = definition.next_after(datetime(2026, 11, 21, 22, 0, tzinfo=UTC))
    for _ in range(200):
        following = definition.next_after(slot)
        assert following > slot, f"next_after({slot}) is {following}, not after it"
        assert following - slot == every
        slot = following


def test_distinct_intervals_are_distinct_schedules() -> None:
    task = standalone_app().task(name="task")(lambda: None)
    intervals = [timedelta(seconds=s) for s in (1, 59, 60, 300, 86_400, 2_592_000, 2_592_001, 31_536_000, 31_536_060)]
    schedules = [Periodic(name="every", task=task, every=every).schedule for every in intervals]
    assert len(set(schedules)) == len(intervals), schedules


@pytest.mark.parametrize("missed", ["skip", "catch_up"])
def test_a_cron_schedule_fires_when_its_slot_has_passed(qdb: QueueDatabase, missed: str) -> None:
    app = qdb.app()

    @app.periodic(cron="* * * * *", name="minutely", missed=missed)
    @app.task(name="minutely")
    def minutely() -> None: ...

    began = database_now(qdb.engine)
    app.sync_periodic()
    assert next_slot(qdb.engine, "minutely") in {
        floor_slot(began, MINUTE) + MINUTE,
        floor_slot(began, MINUTE) + 2 * MINUTE,
    }
    assert app.enqueue_periodic() == 0
    first = floor_slot(began, MINUTE) - 4 * MINUTE
    set_next_slot(qdb.engine, "minutely", first)

    enqueued = app.enqueue_periodic()
    ended = database_now(qdb.engine)
    row = schedule_row(qdb.engine, "minutely")
    latest = aware(row.last_slot_at)
    assert latest in {floor_slot(began, MINUTE), floor_slot(ended, MINUTE)}
    if missed == "catch_up":
        expected = [first + n * MINUTE for n in range((latest - first) // MINUTE + 1)]
        assert len(expected) >= 5
    else:
        expected = [latest]
    assert [slot for slot, _ in periodic_jobs(qdb.engine, "minutely")] == expected
    assert enqueued == len(expected)
    assert aware(row.next_slot_at) == latest + MINUTE
    assert app.enqueue_periodic() == 0


# -- 4. the database clock ---------------------------------------------------------------------------


class _AnHourAhead(datetime):
    """datetime whose now() is an hour ahead of the real clock: an application server's clock gone wrong."""

    @classmethod
    def now(cls, tz: Any = None) -> Any:
        return datetime.now(tz) + HOUR


def test_slots_come_on_the_database_clock(qdb: QueueDatabase, monkeypatch: pytest.MonkeyPatch) -> None:
    app = qdb.app()

    @app.periodic(every=MINUTE, name="clocked")
    @app.task(name="clocked")
    def clocked() -> None: ...

    app.sync_periodic()
    if qdb.family != "sqlite":
        # The application's clock an hour ahead: were it read for the claim or the slots, the slot would
        # fire at once, or be an hour off. (SQLite has no clock of its own: there the application's is the
        # database's.)
        monkeypatch.setattr(dibs.queue.periodic, "datetime", _AnHourAhead)
        monkeypatch.setattr(dibs.dialects.values, "datetime", _AnHourAhead)
    due = floor_slot(database_now(qdb.engine) + 3 * SECOND, SECOND)  # two to three seconds ahead
    set_next_slot(qdb.engine, "clocked", due)
    calls = 0
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        calls += 1
        before = database_now(qdb.engine)
        enqueued = app.enqueue_periodic()
        after = database_now(qdb.engine)
        if enqueued:
            break
        assert after < due + SECOND, "the slot came on the database clock and nothing was enqueued"
        time.sleep(0.05)
    assert enqueued == 1
    assert after >= due, f"enqueued before the database clock reached the slot ({after} < {due})"
    assert calls > 5  # it waited
    ((slot, _),) = periodic_jobs(qdb.engine, "clocked")
    assert slot == due
    assert next_slot(qdb.engine, "clocked") in {floor_slot(before, MINUTE) + MINUTE, floor_slot(after, MINUTE) + MINUTE}


# -- 5. bad definitions ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"every": HOUR, "cron": "0 * * * *"}, id="every-and-cron"),
        pytest.param({}, id="neither"),
        pytest.param({"every": timedelta(0)}, id="every-zero"),
        pytest.param({"every": timedelta(seconds=-5)}, id="every-negative"),
        pytest.param({"every": timedelta(milliseconds=500)}, id="every-under-a-second"),
        pytest.param({"every": 60}, id="every-not-a-timedelta"),
        pytest.param({"cron": "not a cron"}, id="cron-not-a-cron"),
        pytest.param({"cron": "61 * * * *"}, id="cron-minute-out-of-range"),
        pytest.param({"cron": "* * * *"}, id="cron-four-fields"),
        # Valid, but longer than the schedule's stored text: refused before any worker tries to store it.
        pytest.param({"cron": f"{LISTED_MINUTES} {LISTED_HOURS} * * *"}, id="cron-too-long"),
        pytest.param({"every": HOUR, "missed": "later"}, id="missed-later"),
        pytest.param({"every": HOUR, "name": "has spaces"}, id="bad-name"),
        pytest.param({"every": HOUR, "args": {"when": datetime(2026, 1, 1)}}, id="args-not-json"),
        pytest.param({"every": HOUR, "args": ["not", "a", "dict"]}, id="args-not-a-dict"),
        pytest.param({"every": HOUR, "queue": "nowhere"}, id="unknown-queue"),
        pytest.param({"every": HOUR, "priority": "high"}, id="bad-priority"),
        pytest.param({"every": HOUR, "max_attempts": 0}, id="bad-max-attempts"),
        pytest.param({"every": HOUR, "delay": -1}, id="negative-delay"),
        pytest.param({"every": HOUR, "bogus": 1}, id="unknown-option"),
    ],
)
def test_bad_definitions_raise_invalid_argument(options: dict[str, Any]) -> None:
    app = standalone_app()
    task = app.task(name="task")(lambda: None)
    with pytest.raises(dibs.InvalidArgument):
        app.periodic(**options)(task)
    assert app.schedules == {}


def test_a_name_is_registered_once_and_a_task_of_another_app_is_refused() -> None:
    app = standalone_app()
    first = app.task(name="first")(lambda: None)
    second = app.task(name="second")(lambda: None)
    app.periodic(every=HOUR, name="nightly")(first)
    with pytest.raises(dibs.InvalidArgument, match="already registered"):
        app.periodic(cron="0 3 * * *", name="nightly")(second)
    # Without name=, the task's name is the schedule's: twice on one task needs a name.
    app.periodic(every=HOUR)(second)
    with pytest.raises(dibs.InvalidArgument, match="already registered"):
        app.periodic(every=MINUTE)(second)
    other = standalone_app().task(name="elsewhere")(lambda: None)
    with pytest.raises(dibs.InvalidArgument, match="another app"):
        app.periodic(every=HOUR, name="foreign")(other)
    assert sorted(app.schedules) == ["nightly", "second"]
    assert app.schedules["nightly"].task is first


def test_a_schedule_with_a_dedupe_key_option_does_not_stop_the_others(qdb: QueueDatabase) -> None:
    """Each slot's job has its own dedupe key, so dedupe_key= cannot be a periodic option: it must be refused
    when the schedule is defined, not break the upkeep of every schedule of the app at the first slot."""
    app = qdb.app()

    @app.periodic(every=HOUR, name="good")
    @app.task(name="good")
    def good() -> None: ...

    bad = app.task(name="bad")(lambda: None)
    with contextlib.suppress(dibs.InvalidArgument):
        app.periodic(every=HOUR, name="bad", dedupe_key="mine")(bad)
    app.sync_periodic()
    for name in app.schedules:
        set_next_slot(qdb.engine, name, next_slot(qdb.engine, name) - HOUR)
    app.enqueue_periodic()
    assert len(periodic_jobs(qdb.engine, "good")) == 1


# -- 6. jobs run, and `dibs status` shows the schedules ----------------------------------------------


def test_a_running_worker_enqueues_and_runs_the_periodic_job(qdb: QueueDatabase) -> None:
    app = qdb.app()
    ran: list[int] = []

    @app.periodic(every=SECOND, name="pulse")
    @app.task(name="pulse")
    def pulse(context: dibs.JobContext) -> None:
        ran.append(context.job_id)

    assert app.periodic_status() == []
    running = qdb.start(app)
    wait_until(lambda: len(ran) >= 2, timeout=15, what="two slots' jobs to run")
    running.stop()
    assert running.error is None
    finished = all_jobs(qdb.engine)
    assert {job.id for job in finished if job.status == "succeeded"} >= set(ran)
    assert len(set(ran)) == len(ran)
    (status,) = app.periodic_status()
    assert status.name == "pulse"
    assert status.schedule == "every 1s"
    assert status.last_job_id is not None
    assert status.last_job_id >= max(ran)
    assert status.last_slot_at is not None
    assert status.next_slot_at == status.last_slot_at + SECOND


def test_dibs_status_shows_the_periodic_jobs_after_a_worker_ran(tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path / 'periodic.sqlite'}"
    out = tmp_path / "out.txt"
    env = {**os.environ, "DIBS_DATABASE_URL": database, "DIBS_PERIODIC_TEST_OUT": str(out), "COLUMNS": "200"}

    def dibs_command(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([DIBS, *args], capture_output=True, text=True, timeout=60, check=False, cwd=ROOT, env=env)

    assert dibs_command("init").returncode == 0
    before = dibs_command("status")
    assert before.returncode == 0, before.stderr
    assert "periodic jobs" not in before.stdout  # no worker has recorded the schedule yet

    worker = subprocess.Popen(
        [DIBS, "worker", "tests.queue.periodic_app:app", "--grace", "5"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: out.exists() or worker.poll() is not None, timeout=30, what="the periodic job to run")
        assert worker.poll() is None, worker.communicate()
        worker.terminate()
        _, stderr = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 0, stderr
    assert "beat" in out.read_text().splitlines()

    engine = sa.create_engine(database)
    try:
        row = schedule_row(engine, "heartbeat")
        with engine.connect() as conn:
            succeeded = conn.execute(sa.select(sa.func.count()).select_from(jobs).where(jobs.c.status == "succeeded"))
            assert succeeded.scalar_one() >= 1
    finally:
        engine.dispose()
    status = dibs_command("status")
    assert status.returncode == 0, status.stderr
    assert "periodic jobs" in status.stdout
    (line,) = [line for line in status.stdout.splitlines() if "heartbeat" in line]
    cells = [cell.strip() for cell in line.replace("┃", "│").split("│")[1:-1]]
    assert cells == [
        "heartbeat",
        "beat",
        "every 1s",
        aware(row.next_slot_at).strftime("%Y-%m-%d %H:%M:%S"),
        aware(row.last_slot_at).strftime("%Y-%m-%d %H:%M:%S"),
        str(row.last_job_id),
        "no",
    ]


def test_a_burst_worker_runs_the_periodic_job_that_is_due_as_it_starts(qdb: QueueDatabase) -> None:
    """A burst run from cron finds nothing queued: the job of the slot that is due must still be queued and run."""
    app = qdb.app()
    ran: list[int] = []

    @app.periodic(every=HOUR, name="hourly")
    @app.task(name="hourly")
    def hourly(context: dibs.JobContext) -> None:
        ran.append(context.job_id)

    app.sync_periodic()
    for turn in range(1, 4):
        set_next_slot(qdb.engine, "hourly", next_slot(qdb.engine, "hourly") - HOUR)
        stats = qdb.drain(app)
        assert (stats.succeeded, len(ran)) == (1, turn)
        assert next_slot(qdb.engine, "hourly") > database_now(qdb.engine)
