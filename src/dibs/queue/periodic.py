"""Periodic jobs: a task enqueued once per slot of a schedule (``every=`` a timedelta, or a cron expression),
exactly once however many workers run.

Each schedule is a row of ``dibs_periodic`` holding its next slot. Every worker, in its upkeep, claims
the rows whose next slot has come on the database clock; in the claim's own transaction it enqueues the
slot's job and moves the row on to the next slot in the future. A worker that takes the row commits the
job and the move together, and another worker sees the row either locked (skipped) or already moved on.

Slots of ``every=`` schedules are whole multiples of the interval since the Unix epoch (UTC), so every
worker agrees on them; cron expressions are read in UTC. Slots missed while no worker ran are, by the
``missed`` policy, ``skip``\\ ped (one job, for the latest missed slot) or caught up (one job per missed
slot, oldest first, at most :data:`MAX_CATCH_UP`). A new schedule starts at its next slot after it
is first seen; a changed one starts again from its next slot.

A paused schedule enqueues nothing: a worker that finds its slot come moves it on to the next slot, so that
a resume never makes up for the slots that passed while it was paused.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, Row

from dibs._checks import LONGEST, checked_name
from dibs._errors import InvalidArgument
from dibs.claim import claim
from dibs.dialects import backend_for
from dibs.engine import writing
from dibs.queue.enqueue import KEY_LIMIT, insert_jobs, new_job
from dibs.queue.task import TASK_NAME_LIMIT, Task
from dibs.schema import aware, periodic

log = logging.getLogger("dibs.periodic")

MISSED_POLICIES = ("skip", "catch_up")
#: Most missed slots one catch-up enqueues; older ones are skipped, with a warning.
MAX_CATCH_UP = 1000
#: The longest text of a schedule (``cron <expression>``), as dibs_periodic stores it.
SCHEDULE_LIMIT = 200
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True, kw_only=True)
class Periodic:
    """One schedule: ``task`` enqueued with ``args`` at every slot."""

    name: str
    task: Task
    args: Mapping[str, Any] = field(default_factory=dict)
    every: timedelta | None = None
    cron: str | None = None
    missed: str = "skip"
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.every is None) == (self.cron is None):
            raise InvalidArgument("a periodic job needs every= (a timedelta) or cron= (an expression), not both")
        if self.every is not None and (
            not isinstance(self.every, timedelta) or not timedelta(seconds=1) <= self.every <= LONGEST
        ):
            raise InvalidArgument(
                f"every= must be a timedelta of at least one second and at most {LONGEST.days:,} days (100 years), "
                f"got {self.every!r}"
            )
        if self.cron is not None:
            self.next_after(datetime.now(timezone.utc))  # raises InvalidArgument for a bad expression
            if len(self.schedule) > SCHEDULE_LIMIT:
                raise InvalidArgument(
                    f"cron= takes at most {SCHEDULE_LIMIT - len('cron ')} characters (it is stored as the "
                    f"schedule's text), got {len(self.cron or '')}; write its lists as ranges (0-59, not 0,1,...,59)"
                )
        if self.missed not in MISSED_POLICIES:
            raise InvalidArgument(f"missed= must be 'skip' or 'catch_up', got {self.missed!r}")

    @property
    def schedule(self) -> str:
        """The schedule as text: ``every 300s`` or ``cron */5 * * * *``."""
        if self.every is not None:
            # Exact to the microsecond: two different intervals never read the same.
            seconds = f"{self.every.total_seconds():.6f}".rstrip("0").rstrip(".")
            return f"every {seconds}s"
        return f"cron {self.cron}"

    def next_after(self, moment: datetime) -> datetime:
        """The first slot strictly after ``moment`` (aware)."""
        if self.every is not None:
            return _every_after(self.every, moment)
        return next(_cron_after(self.cron or "", moment))

    def slots(self, first: datetime, until: datetime) -> tuple[list[datetime], int]:
        """The slots from ``first`` (itself a slot) to ``until``, both included: the latest MAX_CATCH_UP of
        them, and how many there were in all."""
        if until < first:
            return [], 0
        if self.every is not None:
            count = (until - first) // self.every + 1
            kept = min(count, MAX_CATCH_UP)
            return [first + self.every * n for n in range(count - kept, count)], count
        # One cron iterator walks the missed slots (a year of minutes takes about a second).
        found: deque[datetime] = deque([first], maxlen=MAX_CATCH_UP)
        count = 1
        for slot in _cron_after(self.cron or "", first):
            if slot > until:
                break
            found.append(slot)
            count += 1
        return list(found), count


def _every_after(every: timedelta, moment: datetime) -> datetime:
    # Whole timedeltas, not float seconds: exact, so the slot is always strictly after.
    return _EPOCH + ((moment - _EPOCH) // every + 1) * every


def _cron_after(cron: str, moment: datetime) -> Iterator[datetime]:
    """The slots of a cron expression strictly after ``moment``, in order."""
    try:
        from cronsim import CronSim, CronSimError
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise InvalidArgument("cron schedules need cronsim: pip install 'dibs-sql[cron]'") from exc
    try:
        slots: Iterator[datetime] = CronSim(cron, moment.astimezone(timezone.utc))
        first = next(slots)
    except (CronSimError, StopIteration) as exc:
        raise InvalidArgument(
            f"{cron!r} is not a cron expression dibs can read ({exc}); write five fields, "
            "minute hour day-of-month month day-of-week, such as '*/15 * * * *'"
        ) from exc
    return itertools.chain([first], slots)


def stored_slot_after(schedule: str, moment: datetime) -> datetime | None:
    """The first slot strictly after ``moment`` of a schedule as the table holds it (see Periodic.schedule);
    None for a text this dibs does not write."""
    kind, _, rest = schedule.partition(" ")
    if kind == "cron":
        return next(_cron_after(rest, moment))
    if kind == "every" and rest.endswith("s"):
        try:
            microseconds = int(Decimal(rest[:-1]) * 1_000_000)
        except (ArithmeticError, ValueError):  # not a number, or NaN
            return None
        if microseconds > 0:
            return _every_after(timedelta(microseconds=microseconds), moment)
    return None


@dataclass(frozen=True, kw_only=True)
class PeriodicStatus:
    """One schedule as the database holds it."""

    name: str
    task: str
    schedule: str
    next_slot_at: datetime
    last_slot_at: datetime | None
    last_job_id: int | None
    #: Whether it is paused: its slots pass without a job.
    paused: bool = False


def checked_periodic(
    task: Task,
    *,
    name: str | None,
    every: timedelta | None,
    cron: str | None,
    args: Mapping[str, Any] | None,
    missed: str,
    options: Mapping[str, Any],
) -> Periodic:
    """A schedule, every argument checked; its jobs' arguments and options are checked as enqueue checks them."""
    chosen = checked_name(name or task.name, "a periodic job's name", TASK_NAME_LIMIT)
    fixed = {"dedupe_key", "run_at", "delay"} & set(options)
    if fixed:
        raise InvalidArgument(
            f"a periodic job cannot take {', '.join(sorted(fixed))}: each slot's job gets its own dedupe key "
            "and runs at its slot"
        )
    try:
        new_job(task, args, known_queues=task.app.queues, max_args_bytes=task.app.max_args_bytes, **options)
    except TypeError as exc:
        raise InvalidArgument(
            f"{exc}; a periodic job's options are queue, priority, max_attempts, ordering_key and tag"
        ) from exc
    return Periodic(
        name=chosen, task=task, args=dict(args or {}), every=every, cron=cron, missed=missed, options=dict(options)
    )


def _stored(conn: Connection, moment: datetime) -> datetime:
    """A time as the database column takes it (see Backend.utc_value)."""
    return backend_for(conn.dialect).utc_value(moment)


def _database_now(conn: Connection) -> datetime:
    return aware(conn.execute(sa.select(backend_for(conn.dialect).now())).scalar_one())


def sync_schedules(engine: Engine, schedules: Mapping[str, Periodic]) -> None:
    """Make the table hold every schedule: new ones start at their next slot, changed ones again from it."""
    if not schedules:
        return
    backend = backend_for(engine.dialect)
    with writing(engine) as conn:
        now = _database_now(conn)
        stored = {
            row.name: row.schedule
            for row in conn.execute(
                sa.select(periodic.c.name, periodic.c.schedule).where(periodic.c.name.in_(schedules))
            )
        }
        for name, definition in schedules.items():
            values = {
                "task": definition.task.name,
                "schedule": definition.schedule,
                "next_slot_at": _stored(conn, definition.next_after(now)),
                "updated_at": _stored(conn, now),
            }
            if name not in stored:
                conn.execute(backend.insert_new(periodic, periodic.c.name).values(name=name, **values))
            elif stored[name] != definition.schedule:
                log.info(
                    "periodic job %s changed to %s: next slot %s", name, definition.schedule, values["next_slot_at"]
                )
                conn.execute(
                    sa.update(periodic)
                    .where(periodic.c.name == name, periodic.c.schedule == stored[name])
                    .values(**values)
                )


def set_paused(engine: Engine, name: str, *, paused: bool) -> bool:
    """Pause or resume the schedule recorded as ``name``; False when none is. A resume moves a schedule whose
    slot came while it was paused on to its next slot: no worker did while none ran."""
    backend = backend_for(engine.dialect)
    with writing(engine) as conn:
        row = conn.execute(
            sa.select(periodic.c.schedule, periodic.c.next_slot_at, periodic.c.paused)
            .where(periodic.c.name == name)
            .with_for_update()
        ).first()
        if row is None:
            return False
        values: dict[str, Any] = {"paused": paused, "updated_at": backend.now()}
        now = _database_now(conn)
        if row.paused and not paused and aware(row.next_slot_at) <= now:
            following = stored_slot_after(row.schedule, now)
            if following is not None:
                values["next_slot_at"] = _stored(conn, following)
        conn.execute(sa.update(periodic).where(periodic.c.name == name).values(**values))
    return True


def enqueue_due(engine: Engine, schedules: Mapping[str, Periodic], notify_channel: str | None) -> int:
    """Enqueue the jobs of every schedule whose next slot has come, exactly once per slot; returns how many."""
    if not schedules:
        return 0
    enqueued = 0

    def fire(conn: Connection, rows: Sequence[Row[Any]]) -> None:
        nonlocal enqueued
        now = _database_now(conn)
        for row in rows:
            definition = schedules[row.name]
            if row.schedule != definition.schedule:
                continue  # another version of the app runs this schedule; its workers fire it
            enqueued += _fire_slots(conn, definition, row, now, notify_channel)

    backend = backend_for(engine.dialect)
    claim(
        engine,
        periodic,
        where=[periodic.c.name.in_(list(schedules)), periodic.c.next_slot_at <= backend.now()],
        set={periodic.c.updated_at: backend.now()},
        limit=len(schedules),
        then=fire,
    )
    return enqueued


def slot_key(name: str, slot: datetime) -> str:
    """The dedupe key of the job of a schedule's slot: ``periodic:<name>:<slot>``, with the name's digest for
    a name too long to leave room for the slot (cut short, every slot of it would share one key)."""
    stamp = slot.strftime("%Y%m%dT%H%M%SZ")
    key = f"periodic:{name}:{stamp}"
    if len(key) <= KEY_LIMIT:
        return key
    return f"periodic:{hashlib.sha256(name.encode()).hexdigest()}:{stamp}"


def _fire_slots(
    conn: Connection, definition: Periodic, row: Row[Any], now: datetime, notify_channel: str | None
) -> int:
    """Enqueue the jobs of one schedule's slots that came (none while it is paused) and move it on to its next
    slot after ``now``; returns how many."""
    moved = sa.update(periodic).where(periodic.c.name == row.name)
    if row.paused:
        conn.execute(moved.values(next_slot_at=_stored(conn, definition.next_after(now))))
        return 0
    slots, count = definition.slots(aware(row.next_slot_at), now)
    fired = slots if definition.missed == "catch_up" else slots[-1:]
    if count > 1:
        log.warning(
            "periodic job %s missed %d slots since %s; %s",
            row.name,
            count - 1,
            aware(row.next_slot_at).isoformat(),
            "catching up" if definition.missed == "catch_up" else "skipping to the latest",
        )
    jobs = insert_jobs(
        conn,
        [
            new_job(
                definition.task,
                definition.args,
                known_queues=definition.task.app.queues,
                max_args_bytes=definition.task.app.max_args_bytes,
                dedupe_key=slot_key(row.name, slot),
                **definition.options,
            )
            for slot in fired
        ],
        notify_channel,
    )
    conn.execute(
        moved.values(
            next_slot_at=_stored(conn, definition.next_after(now)),
            last_slot_at=_stored(conn, slots[-1]) if slots else row.last_slot_at,
            last_job_id=jobs[-1].id if jobs else row.last_job_id,
        )
    )
    return len(jobs)


def schedule_status(engine: Engine) -> list[PeriodicStatus]:
    """Every schedule the database holds, by name."""
    with engine.connect() as conn:
        rows = conn.execute(sa.select(periodic).order_by(periodic.c.name)).all()
    return [
        PeriodicStatus(
            name=row.name,
            task=row.task,
            schedule=row.schedule,
            next_slot_at=aware(row.next_slot_at),
            last_slot_at=None if row.last_slot_at is None else aware(row.last_slot_at),
            last_job_id=row.last_job_id,
            paused=bool(row.paused),
        )
        for row in rows
    ]
