"""Enqueueing jobs of one task with the same options: the options checked once, the jobs inserted by column.

The jobs of one call differ only in their arguments (and the ordering key a task derives from them), so the
options are checked for the first job alone and every other job costs its JSON, its ordering key and the
check that its arguments fit the function. The backend inserts them in as few statements as it can (see
:mod:`dibs.dialects.batch`), and each returned :class:`~dibs.Job` is made from what the call knows and the
ids and times the database gave back, without reading the rows again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import MISSING, fields
from typing import Any, NamedTuple
from weakref import WeakKeyDictionary

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.sql import ColumnElement

from dibs._checks import checked_text
from dibs._errors import DibsError, InvalidArgument
from dibs.dialects import Backend, backend_for
from dibs.dialects.base import resolve_times
from dibs.dialects.batch import BatchInsert
from dibs.queue.arguments_json import SCAN_JSON
from dibs.queue.dependencies import link
from dibs.queue.enqueue import (
    KEY_LIMIT,
    NewJob,
    checked_arguments,
    encoded_args,
    insert_untraced,
    new_job,
    refresh,
)
from dibs.queue.job import Job
from dibs.queue.task import Task
from dibs.schema import QUEUED, aware, jobs
from dibs.tracing import active

_DELAY = "dibs_delay"
_RUN_AT = "dibs_run_at"
#: The columns every job of a call shares, bound once per statement.
_SHARED = (
    "task",
    "queue",
    "priority",
    "status",
    "max_attempts",
    "dedupe_key",
    "tag",
    "on_parent_failure",
    "headers",
)
#: What a job holds when it was just inserted, beyond what the call gave: every field's default, and these.
_FRESH = {
    **{field.name: field.default for field in fields(Job) if field.default is not MISSING},
    "attempts": 0,
    "started_at": None,
    "finished_at": None,
    "last_error": None,
    "lease_owner": None,
    "cancel_requested": False,
}


class Batch(NamedTuple):
    """The checked jobs of one call: the first whole, the others by their arguments' JSON and keys."""

    first: NewJob
    args: list[str]
    #: Each job's arguments as their JSON decodes, where known without decoding it, else None.
    decoded: list[dict[str, Any] | None]
    #: Each job's ordering key where the task derives it from the arguments, else None (the first's).
    keys: list[str | None] | None


def new_batch(
    task: Task, many_args: Iterable[Mapping[str, Any] | None], *, known_queues: frozenset[str], max_args_bytes: int,
    **options: Any,
) -> Batch | None:  # fmt: skip
    """Check the jobs of one call (None for none); InvalidArgument saying what to change for the first bad one."""
    given = iter(many_args)
    first_args = next(given, _NONE)
    if first_args is _NONE:
        return None
    first = new_job(task, first_args, known_queues=known_queues, max_args_bytes=max_args_bytes, **options)
    derived = options.get("ordering_key") is None and task.ordering_key is not None
    args, decoded = [first.values["args"]], [first.decoded]
    keys: list[str | None] | None = [first.values["ordering_key"]] if derived else None
    for each in given:
        arguments = task.dumped(checked_arguments(task, {} if each is None else each))
        text, copy = encoded_args(task, arguments, max_args_bytes)
        args.append(text)
        decoded.append(copy)
        if keys is not None:
            key = task.key_for(arguments)
            if key is not None:
                checked_text(key, "ordering_key", KEY_LIMIT)
            keys.append(key)
        refusal = task.refusal(arguments)
        if refusal is not None:
            raise InvalidArgument(f"the arguments of a {task.name!r} job do not fit the task: {refusal}")
    return Batch(first, args, decoded, keys)


_NONE: Any = object()


def jobs_of(batch: Batch) -> list[NewJob]:
    """The batch as one NewJob each, for the inserts that go job by job."""
    first = batch.first
    keys = batch.keys or [first.values["ordering_key"]] * len(batch.args)
    return [
        NewJob(values={**first.values, "args": args, "ordering_key": key}, delay=first.delay,
               run_at=first.run_at, parents=first.parents)
        for args, key in zip(batch.args, keys, strict=True)
    ]  # fmt: skip


#: The batch INSERT of each engine's dialect, by (timed by run_at, ordering keys per job, channel).
_inserts: WeakKeyDictionary[Dialect, dict[tuple[bool, bool, str | None], BatchInsert | None]] = WeakKeyDictionary()


def _insert(conn: Connection, backend: Backend, batch: Batch, channel: str | None) -> BatchInsert | None:
    shape = (batch.first.run_at is not None, batch.keys is not None, channel)
    known = _inserts.setdefault(conn.dialect, {})
    if shape not in known:
        timed = batch.first.run_at is not None
        run_at = sa.bindparam(_RUN_AT, type_=jobs.c.run_at.type) if timed else backend.after(_DELAY)
        varying = ["args", "ordering_key"] if batch.keys is not None else ["args"]
        shared: dict[str, ColumnElement[Any]] = {
            name: sa.bindparam(name, type_=jobs.c[name].type)
            for name in (*_SHARED, "ordering_key")
            if name not in varying
        }
        shared.update(run_at=run_at, enqueued_at=backend.now())
        read = [jobs.c.run_at, jobs.c.enqueued_at]
        known[shape] = backend.batch_insert(conn.dialect, jobs, shared, varying, read, channel)
    return known[shape]


def insert_batch(conn: Connection, batch: Batch, channel: str | None) -> list[Job]:
    """Insert the batch on ``conn`` (in its transaction), in an enqueue span when tracing; returns its jobs as
    stored, in order."""
    traced = active()
    if traced is None:
        return _insert_batch(conn, batch, channel)
    with traced.enqueue(batch.first.values["queue"], len(batch.args)) as headers:
        batch.first.values["headers"] = headers
        return _insert_batch(conn, batch, channel)


def _insert_batch(conn: Connection, batch: Batch, channel: str | None) -> list[Job]:
    first = batch.first
    backend = backend_for(conn.dialect)
    insert = None if first.values["dedupe_key"] is not None else _insert(conn, backend, batch, channel)
    if insert is None:  # each job with a dedupe key is looked for on its own, as are rows of drivers without ids
        return insert_untraced(conn, jobs_of(batch), channel)
    parameters = {name: first.values[name] for name in (*_SHARED, "ordering_key")}
    if first.run_at is None:
        parameters[_DELAY] = backend.after_value(first.delay or 0.0)
    else:
        parameters[_RUN_AT] = backend.utc_value(first.run_at)
    if channel is not None and first.values["status"] == QUEUED:
        parameters["dibs_payload"] = first.values["queue"]
    columns: dict[str, list[Any]] = {"args": batch.args}
    if batch.keys is not None:
        columns["ordering_key"] = batch.keys
    drafts: list[Job] = []
    stored = insert.run(conn, resolve_times(parameters), columns, lambda: drafts.extend(drafted_jobs(batch)))
    made = stored_jobs(drafts, stored)
    if first.parents:
        return _linked(conn, backend, made, first.parents, channel)
    return made


def drafted_jobs(batch: Batch) -> list[Job]:
    """The jobs of ``batch`` as they will be stored, but for their ids and times (see :func:`stored_jobs`):
    made while the database inserts them, where the driver allows."""
    first = batch.first
    fields = {**_FRESH, **first.values, "id": 0, "run_at": None, "enqueued_at": None}
    del fields["on_parent_failure"], fields["headers"]
    keys = batch.keys or [first.values["ordering_key"]] * len(batch.args)
    made: list[Job] = []
    for args, key in zip(_decoded(batch), keys, strict=True):
        fields["args"], fields["ordering_key"] = args, key
        made.append(Job.made(fields))
    return made


def _decoded(batch: Batch) -> list[dict[str, Any]]:
    """Each job's arguments as its JSON decodes: the copies made as they were encoded, the others decoded."""
    decoded = list(batch.decoded)
    missing = [at for at, args in enumerate(decoded) if args is None]
    if missing:
        # The encoder made each JSON without whitespace around it: joined into one array, the decoder's
        # scanner reads them all in one call, in half the time of a call per job.
        texts = SCAN_JSON("[" + ",".join(batch.args[at] for at in missing) + "]", 0)[0]
        for at, args in zip(missing, texts, strict=True):
            decoded[at] = args
    return decoded  # type: ignore[return-value]


def stored_jobs(drafts: list[Job], stored: list[Any]) -> list[Job]:
    """The drafted jobs, given the ids and times the database made for them (``stored``, in their order)."""
    made = sum(len(ids) for ids, _ in stored)
    if made != len(drafts):
        raise DibsError(
            f"the database made {made} rows for the {len(drafts)} jobs of this batch: a trigger or rule on "
            "dibs_jobs left rows out, so which row is which job is unknown; the call failed (in a transaction "
            "of its own nothing was kept; in yours, roll it back) and the trigger or rule needs to go"
        )
    jobs = iter(drafts)
    for ids, (run_at, enqueued_at) in stored:
        run_at, enqueued_at = aware(run_at), aware(enqueued_at)
        for job_id in ids:
            # Filled in place: the jobs were made for this, and no one has seen them yet.
            fields = next(jobs).__dict__
            fields["id"], fields["run_at"], fields["enqueued_at"] = job_id, run_at, enqueued_at
    return drafts


def _linked(
    conn: Connection, backend: Backend, made: list[Job], parents: tuple[int, ...], channel: str | None
) -> list[Job]:
    """The jobs, linked to the parents they wait for: linking queues (or cancels) those whose parents finished."""
    link(conn, [(job.id, parents) for job in made])
    stored: list[Job | None] = list(made)
    refresh(conn, stored, {job.id for job in made})
    found = [job for job in stored if job is not None]
    notify = backend.notify(channel) if channel else None
    if notify is not None and any(job.status == QUEUED for job in found):
        conn.execute(notify, {"dibs_payload": found[0].queue})
    return found
