"""Enqueue: validate a job completely, then insert it, alone, in bulk, or in the caller's transaction.

A job is validated before anything is written, so a bad one (arguments that are not JSON, an unknown
queue, a negative delay) raises :class:`~dibs.InvalidArgument` and nothing of the call is stored.
Jobs without a dedupe key go in one multi-row INSERT; a job with one is inserted only if no live job
has the key, else the live job is returned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import repeat
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dibs._checks import checked_attempts, checked_moment, checked_name, checked_priority, checked_seconds, checked_text
from dibs._errors import DibsError, InvalidArgument, UnknownQueue, UnknownTask
from dibs.dialects import Backend, backend_for
from dibs.dialects.base import resolve_times
from dibs.dialects.inserts import Returning
from dibs.queue.arguments_json import NAMES, encoded
from dibs.queue.dependencies import link, parent_ids
from dibs.queue.job import Job
from dibs.queue.task import TASK_NAME_LIMIT, Task
from dibs.schema import (
    CANCEL_ON_PARENT_FAILURE,
    LIVE,
    QUEUED,
    RUN_ON_PARENT_FAILURE,
    SCHEDULED,
    WAITING,
    jobs,
)
from dibs.tracing import active

#: PostgreSQL wakes idle workers on this channel when jobs are enqueued.
CHANNEL = "dibs_jobs"

_DELAY = "dibs_delay"
_RUN_AT = "dibs_run_at"
KEY_LIMIT = 200
#: How many times a dedupe insert is tried when the live job it collided with finished before it was read.
_DEDUPE_TRIES = 5


@dataclass(frozen=True, kw_only=True)
class NewJob:
    """One validated job, ready to insert."""

    values: dict[str, Any]
    delay: float | None  # seconds from now on the database clock, or None when run_at is given
    run_at: datetime | None
    #: The jobs it waits for (``after=``), in order.
    parents: tuple[int, ...] = ()
    #: Its arguments as their JSON decodes, where known without decoding it (see :mod:`.arguments_json`).
    decoded: dict[str, Any] | None = None


def new_job(
    task: Task,
    args: Mapping[str, Any] | None,
    *,
    known_queues: frozenset[str],
    max_args_bytes: int,
    queue: str | None = None,
    priority: int | None = None,
    run_at: datetime | None = None,
    delay: timedelta | float | int | None = None,
    max_attempts: int | None = None,
    dedupe_key: str | None = None,
    ordering_key: str | None = None,
    tag: str | None = None,
    after: Sequence[Any] | None = None,
    on_parent_failure: str | None = None,
) -> NewJob:
    """Check every option of one job; InvalidArgument saying what to change for the first bad one."""
    arguments = task.dumped(checked_arguments(task, {} if args is None else args))
    text, decoded = encoded_args(task, arguments, max_args_bytes)
    chosen_queue = task.queue if queue is None else checked_name(queue, "queue")
    if queue is not None and chosen_queue not in known_queues:
        raise UnknownQueue(
            f"no task is on queue {chosen_queue!r} and App(queues=...) does not declare it; "
            f"known queues: {', '.join(sorted(known_queues))}"
        )
    if run_at is not None and delay is not None:
        raise InvalidArgument("give run_at or delay, not both")
    seconds: float | None = 0.0 if delay is None else checked_seconds(delay, "delay", zero=True)
    when: datetime | None = None
    if run_at is not None:
        when, seconds = checked_moment(run_at, "run_at"), None
    key = task.key_for(arguments) if ordering_key is None else ordering_key
    if dedupe_key is not None:
        checked_text(dedupe_key, "dedupe_key", KEY_LIMIT)
    if key is not None:
        checked_text(key, "ordering_key", KEY_LIMIT)
    chosen_tag = task.tag if tag is None else checked_name(tag, "tag")
    parents = () if after is None else parent_ids(after)
    policy = _parent_failure(on_parent_failure, parents, dedupe_key)
    refusal = task.refusal(arguments)
    if refusal is not None:
        raise InvalidArgument(f"the arguments of a {task.name!r} job do not fit the task: {refusal}")
    values = {
        "task": task.name,
        "queue": chosen_queue,
        "args": text,
        "priority": task.priority if priority is None else checked_priority(priority),
        # A job that must wait is scheduled; the queue moves it to queued when its time comes on the
        # database clock, so the claim never reads jobs that are not runnable yet.
        # A job enqueued after others waits for them, and is then queued or scheduled by its run time.
        "status": WAITING if parents else QUEUED if seconds == 0.0 else SCHEDULED,
        "max_attempts": task.max_attempts if max_attempts is None else checked_attempts(max_attempts),
        "dedupe_key": dedupe_key,
        "ordering_key": key,
        "tag": chosen_tag,
        "on_parent_failure": policy,
        "headers": None,  # the enqueuer's trace context, set as the job is inserted inside a trace
    }
    return NewJob(values=values, delay=seconds, run_at=when, parents=parents, decoded=decoded)


def waiting_for(new: NewJob, parents: Sequence[int]) -> NewJob:
    """``new``, made to wait for ``parents`` (a step of a chain or a group's callback, whose parents are
    inserted with it)."""
    policy = new.values["on_parent_failure"] or CANCEL_ON_PARENT_FAILURE
    values = {**new.values, "status": WAITING, "on_parent_failure": policy}
    return NewJob(values=values, delay=new.delay, run_at=new.run_at, parents=(*new.parents, *parents))


def _parent_failure(policy: str | None, parents: tuple[int, ...], dedupe_key: str | None) -> str | None:
    """The checked ``on_parent_failure`` of a job waiting for ``parents`` (None for a job waiting for none)."""
    if not parents:
        if policy is not None:
            raise InvalidArgument("on_parent_failure applies to a job enqueued with after=; give after too")
        return None
    if dedupe_key is not None:
        raise InvalidArgument("a job enqueued with after= cannot have a dedupe_key; give one or the other")
    return checked_parent_failure(policy)


def checked_parent_failure(policy: object) -> str:
    """An ``on_parent_failure`` policy (None: the default, cancel), if it is one."""
    chosen = CANCEL_ON_PARENT_FAILURE if policy is None else policy
    if chosen not in (CANCEL_ON_PARENT_FAILURE, RUN_ON_PARENT_FAILURE):
        raise InvalidArgument(
            f"on_parent_failure must be {CANCEL_ON_PARENT_FAILURE!r} (the job is cancelled when a job it waits "
            f"for dies or is cancelled) or {RUN_ON_PARENT_FAILURE!r} (it runs anyway), got {policy!r}"
        )
    return str(chosen)


def checked_arguments(task: Task, arguments: Any) -> Mapping[str, Any]:
    """A job's arguments, if they are a dict of argument names."""
    if type(arguments) is dict and NAMES.issuperset(map(type, arguments)):
        return arguments  # the common case, at half the cost of the general check
    if not isinstance(arguments, Mapping) or not all(map(isinstance, arguments, repeat(str))):
        raise InvalidArgument(
            f"the arguments of a {task.name!r} job must be a dict of argument names to values, got {arguments!r}"
        )
    return arguments


def encoded_args(task: Task, arguments: Mapping[str, Any], max_args_bytes: int) -> tuple[str, dict[str, Any] | None]:
    """A job's arguments as JSON text, within the size limit, and what the text decodes to where that is
    known without decoding it (see :func:`~dibs.queue.arguments_json.encoded`)."""
    try:
        text, decoded = encoded(arguments)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(
            f"the arguments of a {task.name!r} job are not JSON ({exc}); pass only str, int, float, bool, "
            "None, lists and dicts, and turn other values (dates, ids, objects) into one of those first"
        ) from exc
    # The encoder escapes every non-ASCII character, so the text has as many bytes as characters.
    size = len(text)
    if size > max_args_bytes:
        raise InvalidArgument(
            f"the arguments of a {task.name!r} job take {size:,} bytes as JSON, over the limit of "
            f"{max_args_bytes:,}; store large data elsewhere and pass its id, or raise App(max_args_bytes=)"
        )
    return text, decoded


def insert_jobs(conn: Connection, new: Sequence[NewJob], notify_channel: str | None) -> list[Job]:
    """Insert validated jobs on ``conn`` (in its transaction); returns them as stored, in order."""
    traced = active()
    if traced is None or not new:
        return insert_untraced(conn, new, notify_channel)
    queues = {job.values["queue"] for job in new}
    with traced.enqueue(queues.pop() if len(queues) == 1 else "*", len(new)) as headers:
        for job in new:
            job.values["headers"] = headers
        return insert_untraced(conn, new, notify_channel)


def insert_untraced(conn: Connection, new: Sequence[NewJob], notify_channel: str | None) -> list[Job]:
    """:func:`insert_jobs` without a span of its own (inside one already, or with tracing off)."""
    backend = backend_for(conn.dialect)
    stored: list[Job | None] = [None] * len(new)
    plain = [index for index, job in enumerate(new) if job.values["dedupe_key"] is None]
    for group in (
        [index for index in plain if new[index].run_at is None],
        [index for index in plain if new[index].run_at is not None],
    ):
        if group:
            for index, job in zip(group, _insert_many(conn, backend, [new[index] for index in group]), strict=True):
                stored[index] = job
    for index, waiting in enumerate(new):
        if waiting.values["dedupe_key"] is not None:
            stored[index] = _insert_deduplicated(conn, backend, waiting)
    children = [(job.id, waiting.parents) for job, waiting in zip(stored, new, strict=True) if job and waiting.parents]
    if children:
        link(conn, children)
        refresh(conn, stored, {child for child, _ in children})
    notify = backend.notify(notify_channel) if notify_channel else None
    if notify is not None and new:
        queues = sorted({job.values["queue"] for job in new})
        conn.execute(notify, {"dibs_payload": ",".join(queues)})
    return [job for job in stored if job is not None]


def refresh(conn: Connection, stored: list[Job | None], ids: set[int]) -> None:
    """Read these jobs again: linking them may have queued (or cancelled) them at once."""
    rows = {row.id: row for row in conn.execute(sa.select(jobs).where(jobs.c.id.in_(sorted(ids))))}
    for index, job in enumerate(stored):
        if job is not None and job.id in rows:
            stored[index] = Job.from_row(rows[job.id])


#: Insert statements by (backend, timed by run_at, skipping dedupe conflicts, returning): building one costs
#: more than running it.
_statements: dict[tuple[str, bool, bool, str], sa.Insert] = {}


def _statement(
    backend: Backend, job: NewJob, *, deduplicated: bool = False, returning: Returning = "rows"
) -> sa.Insert:
    """The INSERT for jobs like ``job``; ``returning``: "rows", "sorted rows" (for executemany) or "none"."""
    key = (backend.name, job.run_at is not None, deduplicated, returning)
    statement = _statements.get(key)
    if statement is None:
        run_at = backend.after(_DELAY) if job.run_at is None else sa.bindparam(_RUN_AT, type_=jobs.c.run_at.type)
        base = backend.insert_new(jobs, jobs.c.dedupe_key) if deduplicated else sa.insert(jobs)
        statement = base.values(
            {
                **{name: sa.bindparam(name, type_=jobs.c[name].type) for name in job.values},
                "run_at": run_at,
                "enqueued_at": backend.now(),
            }
        )
        if returning != "none":
            statement = statement.returning(*jobs.columns, sort_by_parameter_order=returning == "sorted rows")
        _statements[key] = statement
    return statement


def _parameters(backend: Backend, job: NewJob) -> dict[str, Any]:
    parameters = dict(job.values)
    if job.run_at is None:
        parameters[_DELAY] = backend.after_value(job.delay or 0.0)
    else:
        parameters[_RUN_AT] = backend.utc_value(job.run_at)
    return resolve_times(parameters)


def _insert_many(conn: Connection, backend: Backend, new: Sequence[NewJob]) -> list[Job]:
    parameters = [_parameters(backend, job) for job in new]
    inserted = backend.insert_rows(conn, lambda returning: _statement(backend, new[0], returning=returning), parameters)
    if not inserted.ids:
        return [Job.from_row(row) for row in inserted.rows]
    rows = {row.id: row for row in conn.execute(sa.select(jobs).where(jobs.c.id.in_(inserted.ids)))}
    return [Job.from_row(rows[job_id]) for job_id in inserted.ids]


def _insert_deduplicated(conn: Connection, backend: Backend, job: NewJob) -> Job:
    def statement(returning: Returning) -> sa.Insert:
        return _statement(backend, job, deduplicated=True, returning=returning)

    # A locking read sees the latest committed row even inside a caller's REPEATABLE READ transaction
    # (MySQL's default), whose snapshot may predate the job that holds the key.
    live = (
        sa.select(jobs)
        .where(jobs.c.dedupe_key == job.values["dedupe_key"], jobs.c.status.in_(LIVE))
        .with_for_update(read=True)
    )
    for _ in range(_DEDUPE_TRIES):
        inserted = backend.insert_one_new(conn, statement, _parameters(backend, job))
        if isinstance(inserted, int):
            return Job.from_row(conn.execute(sa.select(jobs).where(jobs.c.id == inserted)).one())
        if inserted is not None:
            return Job.from_row(inserted)
        existing = conn.execute(live).first()
        if existing is not None:
            return Job.from_row(existing)
    raise DibsError(
        f"the live job holding dedupe key {job.values['dedupe_key']!r} could not be read back (it kept "
        "finishing as this enqueue looked for it); nothing was enqueued: enqueue again"
    )


def task_named(tasks: Mapping[str, Task], name: object, *, by_function: bool = True) -> Task:
    """The registered task of that name, or else (``by_function``) the one task whose function has that
    name (``slow`` for ``tasks.slow``); UnknownTask listing the registered ones otherwise. Code enqueues by
    the full name (``by_function=False``): a short name would stop resolving the day another task's
    function got the same name."""
    if isinstance(name, Task):
        if tasks.get(name.name) is not name:
            raise UnknownTask(f"task {name.name!r} is registered with another app, not this one")
        return name
    task = tasks.get(checked_name(name, "a task name", TASK_NAME_LIMIT))
    if task is not None:
        return task
    matches = [task for task in tasks.values() if task.function.__name__ == name]
    if by_function and len(matches) == 1:
        return matches[0]
    known = ", ".join(sorted(tasks)) or "none yet"
    names = ", ".join(sorted(task.name for task in matches))
    if len(matches) > 1:
        raise UnknownTask(f"{name!r} is the function of several tasks ({names}); name one of them in full")
    if matches:
        raise UnknownTask(f"no task named {name!r} is registered; did you mean {names!r}, its full name?")
    raise UnknownTask(f"no task named {name!r} is registered; registered tasks: {known}")
