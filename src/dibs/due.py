"""The due scheduler: many workers take the due rows of the user's own table (feeds, syncs, crawls), each row
by one worker at a time, holding a lease instead of a row lock while its handler does slow I/O.

A row is due when it is enabled and ``last_run IS NULL OR last_run <= now - interval`` on the database
clock, with the interval a constant, a column (seconds or minutes) or any SQL expression in seconds.
Due rows are taken by priority (highest first), then oldest last run first, never-run rows before all;
the limit applies after the due test. Each claimed row gets a fenced lease; its handler runs with no
transaction open; then the row is marked done (``last_run = now``), failed (its error kept, and due
again by the normal rule, or after ``retry_after``) or released. A worker that dies leaves its rows
to be taken again when their leases expire.

The scheduler needs a few columns beyond the table's own; :func:`due_columns` makes them for a new
table and :func:`add_due_columns` adds them to an existing one.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine, Row

from dibs._checks import checked_count
from dibs._errors import InvalidArgument
from dibs.claim import column_of, resolve_table, whole_number
from dibs.dialects import Backend, backend_for
from dibs.dialects.base import moment
from dibs.lease import Claimer, Duration, Lease, Leases, _seconds
from dibs.schema import Timestamp

IDLE, RUNNING = "idle", "running"
#: Errors are kept up to this many characters.
ERROR_LIMIT = 10_000
_RETRY_AFTER = "dibs_retry_after"
#: How many times the run loop claims again while rows read as due but the claim found none.
_EMPTY_CLAIM_TRIES = 50
_DUE_CUTOFF = "dibs_due_cutoff"

#: The scheduler's own columns and their default names.
DUE_COLUMN_NAMES = {
    "status": "lease_status",
    "owner": "lease_owner",
    "expires_at": "lease_expires_at",
    "token": "lease_token",
    "runs": "run_count",
    "last_error": "last_error",
}


def due_columns(**names: str) -> list[sa.Column[Any]]:
    """Fresh columns the due scheduler needs, to add to your Table definition (names overridable by the keys
    of :data:`DUE_COLUMN_NAMES`): a lease status, owner, expiry and token, a run count, and the last error."""
    chosen = _names(names)
    return [
        sa.Column(chosen["status"], sa.String(16), nullable=False, server_default=IDLE),
        sa.Column(chosen["owner"], sa.String(200), nullable=True),
        sa.Column(chosen["expires_at"], Timestamp, nullable=True),
        sa.Column(chosen["token"], sa.BigInteger, nullable=False, server_default="0"),
        sa.Column(chosen["runs"], sa.Integer, nullable=False, server_default="0"),
        sa.Column(chosen["last_error"], sa.Text, nullable=True),
    ]


def add_due_columns(bind: Engine, table: Any, **names: str) -> list[str]:
    """Add the scheduler's columns that ``table`` lacks in the database (ALTER TABLE ... ADD COLUMN), and to the
    Table object if it lacks them too; returns the names added to the database. Safe to run at every start:
    it changes nothing when they are all there."""
    resolved = resolve_table(table)
    for column in due_columns(**names):
        if column.name not in resolved.c:
            resolved.append_column(column)
    with bind.begin() as conn:
        present = {column["name"] for column in sa.inspect(conn).get_columns(resolved.name, schema=resolved.schema)}
        added = []
        preparer = conn.dialect.identifier_preparer
        for column in due_columns(**names):
            if column.name in present:
                continue
            spec = sa.schema.CreateColumn(column).compile(dialect=conn.dialect)
            conn.exec_driver_sql(f"ALTER TABLE {preparer.format_table(resolved)} ADD COLUMN {spec}")
            added.append(column.name)
    return added


def _names(names: Mapping[str, str]) -> dict[str, str]:
    unknown = set(names) - set(DUE_COLUMN_NAMES)
    if unknown:
        raise InvalidArgument(
            f"unknown scheduler column(s) {sorted(unknown)}; the names that can be changed are "
            f"{', '.join(DUE_COLUMN_NAMES)}"
        )
    return {**DUE_COLUMN_NAMES, **names}


@dataclass
class DueStats:
    """What one :meth:`DueScheduler.run` did. ``errors``: each failed source's key and error."""

    claimed: int = 0
    succeeded: int = 0
    failed: int = 0
    #: Sources whose outcome was not recorded because their lease had been taken over (they overran it).
    lost: int = 0
    errors: dict[Any, str] = field(default_factory=dict)


Handler = Callable[[Row[Any]], Any]


class DueScheduler:
    """Takes due rows of ``table`` (a Table or an ORM class with a primary key) with fenced leases.

    ``last_run``: the column of the last run's time. ``interval``: a timedelta or number of seconds (the same
    for every row), a column name or Column (per row, in ``interval_unit``: seconds or minutes), or any SQL
    expression giving seconds. ``enabled``: a boolean column; rows where it is false are never due.
    ``priority``: a column; higher goes first. ``lease``: how long a claimed row is held (renewed while its
    handler runs). ``retry_after``: after a failure, due again this long after it (default: by the normal
    due rule, one interval after the failed run). Other keywords name the scheduler's own columns
    (see :func:`due_columns`).
    """

    def __init__(
        self,
        table: Any,
        *,
        last_run: str | sa.Column[Any] = "last_run_at",
        interval: Duration | str | sa.ColumnElement[Any],
        interval_unit: str = "seconds",
        enabled: str | sa.Column[Any] | None = None,
        priority: str | sa.Column[Any] | None = None,
        lease: Duration = timedelta(minutes=5),
        retry_after: Duration | None = None,
        strategy: str | None = None,
        **columns: str,
    ) -> None:
        self.table = resolve_table(table)
        self.last_run = column_of(self.table, last_run, "DueScheduler(last_run=)")
        self.enabled = None if enabled is None else column_of(self.table, enabled, "DueScheduler(enabled=)")
        self.priority = None if priority is None else column_of(self.table, priority, "DueScheduler(priority=)")
        if interval_unit not in ("seconds", "minutes"):
            raise InvalidArgument(f"interval_unit must be 'seconds' or 'minutes', got {interval_unit!r}")
        self.constant_interval: float | None = None
        self.interval_seconds: sa.ColumnElement[Any] | None = None
        if interval_unit != "seconds" and not isinstance(interval, (str, sa.Column)):
            raise InvalidArgument(
                f"interval_unit={interval_unit!r} applies to an interval column only; give a constant as a "
                "timedelta (timedelta(minutes=5)) and an expression in seconds"
            )
        if isinstance(interval, (timedelta, int, float)) and not isinstance(interval, bool):
            self.constant_interval = _seconds(interval, "interval")
        elif isinstance(interval, (str, sa.Column)):
            column = column_of(self.table, interval, "DueScheduler(interval=)")
            self.interval_seconds = column * 60 if interval_unit == "minutes" else column
        elif isinstance(interval, sa.ColumnElement):
            self.interval_seconds = interval
        else:
            raise InvalidArgument(
                "interval must be a timedelta or seconds (the same for every row), a column name or Column "
                f"(per row), or a SQL expression in seconds; got {interval!r}"
            )
        self.lease_seconds = _seconds(lease, "lease")
        self.retry_after = None if retry_after is None else _seconds(retry_after, "retry_after")
        names = _names(columns)
        try:
            self.last_error = column_of(self.table, names["last_error"], "DueScheduler(last_error=)")
            self.leases = Leases(
                self.table,
                status=names["status"],
                owner=names["owner"],
                expires_at=names["expires_at"],
                token=names["token"],
                attempts=names["runs"],
                ready=IDLE,
                running=RUNNING,
                done=IDLE,
                failed=IDLE,
                strategy=strategy,
            )
        except InvalidArgument as exc:
            raise InvalidArgument(
                f"{exc}. The due scheduler needs its own columns on {self.table.name}: add them with "
                "dibs.add_due_columns(engine, table) (or dibs.due_columns() in a new Table definition)"
            ) from exc
        self._claimers: dict[str, Claimer] = {}
        # The clock expressions of the writes, one per database: a write is built once per expression.
        self._clocks: dict[str, tuple[Any, Any]] = {}

    # -- the due test ------------------------------------------------------------------------------

    def due(self, bind: Engine) -> list[sa.ColumnElement[bool]]:
        """The criteria of a due row on ``bind``'s database, as SQL, evaluated on the database clock now."""
        backend = backend_for(bind.dialect)
        cutoff = None if self.constant_interval is None else moment(backend, -self.constant_interval, _DUE_CUTOFF)
        return self._due(backend, cutoff)

    def _due(self, backend: Backend, cutoff: sa.ColumnElement[Any] | None) -> list[sa.ColumnElement[bool]]:
        criteria: list[sa.ColumnElement[bool]] = []
        if self.enabled is not None:
            criteria.append(self.enabled.is_(True))
        if cutoff is not None:
            ready = self.last_run <= cutoff
        else:
            assert self.interval_seconds is not None
            ready = backend.elapsed(self.last_run, self.interval_seconds)
        criteria.append(sa.or_(self.last_run.is_(None), ready))
        # A failed row waits out its retry_after: the expiry of an idle row's lease says until when.
        leases = self.leases
        criteria.append(sa.or_(leases.status != IDLE, leases.expires_at.is_(None), leases.expires_at < backend.now()))
        return criteria

    def order(self) -> list[sa.ColumnElement[Any]]:
        """Priority first (highest), then never-run rows, then the oldest last run."""
        order: list[sa.ColumnElement[Any]] = []
        if self.priority is not None:
            # Rows without a priority after those with one, on every database (PostgreSQL puts NULLs first).
            order += [sa.case((self.priority.is_(None), 1), else_=0), self.priority.desc()]
        # NULLS FIRST, written so MySQL and MariaDB (which lack it) order the same way.
        order += [sa.case((self.last_run.is_(None), 0), else_=1), self.last_run]
        return order

    def due_rows(self, bind: Engine, limit: int = 100) -> list[Row[Any]]:
        """The due rows a claim would take next, in that order, without claiming them (for inspection)."""
        held = self.leases.eligible(backend_for(bind.dialect))
        query = sa.select(self.table).where(held, *self.due(bind)).order_by(*self.order())
        query = query.limit(checked_count(limit, "limit", minimum=0))
        with bind.connect() as conn:
            return list(conn.execute(query))

    # -- claim and finish --------------------------------------------------------------------------

    def claim(self, bind: Engine, *, owner: str, limit: int = 1) -> list[Lease]:
        """Lease up to ``limit`` due rows to ``owner``; the limit applies after the due test."""
        backend = backend_for(bind.dialect)
        claimer = self._claimers.get(backend.name)
        if claimer is None:
            # Built once per database: the constant interval's cutoff is a parameter, given per call.
            cutoff = None if self.constant_interval is None else backend.after(_DUE_CUTOFF)
            claimer = self._claimers[backend.name] = self.leases.claimer(
                where=self._due(backend, cutoff), order_by=self.order()
            )
        parameters = None
        if self.constant_interval is not None:
            parameters = {_DUE_CUTOFF: backend.after_value(-self.constant_interval)}
        return list(
            claimer.claim(
                bind, owner=owner, duration=self.lease_seconds, limit=whole_number(limit), parameters=parameters
            )
        )

    def done(self, bind: Engine, held: Sequence[Lease]) -> list[Lease]:
        """Mark rows run now (``last_run`` = the database clock, error cleared); returns the leases lost."""
        now, _ = self._clock(bind)
        return self.leases.complete_many(bind, held, set={self.last_run: now, self.last_error: None})

    def failed(self, bind: Engine, held: Sequence[Lease], error: str) -> list[Lease]:
        """Record a failed run: the error kept, and the row due again by the normal rule (``last_run`` = now) or,
        with ``retry_after``, that long from now. Returns the leases lost."""
        backend = backend_for(bind.dialect)
        now, retry_at = self._clock(bind)
        values: dict[Any, Any] = {self.last_error: error[:ERROR_LIMIT]}
        parameters: dict[str, Any] = {}
        if self.retry_after is None:
            values[self.last_run] = now
        else:
            values[self.leases.expires_at] = retry_at
            parameters[_RETRY_AFTER] = backend.after_value(self.retry_after)
        return self.leases.fail_many(bind, held, set=values, parameters=parameters)

    def _clock(self, bind: Engine) -> tuple[Any, Any]:
        """The database clock now, and ``retry_after`` from now, as expressions made once per database."""
        backend = backend_for(bind.dialect)
        clock = self._clocks.get(backend.name)
        if clock is None:
            clock = self._clocks[backend.name] = (backend.now(), backend.after(_RETRY_AFTER))
        return clock

    def release(self, bind: Engine, held: Sequence[Lease]) -> list[Lease]:
        """Give rows back unrun: due again at once, the run not counted. Returns the leases lost."""
        return self.leases.release_many(bind, held)

    # -- the run loop ------------------------------------------------------------------------------

    def run(
        self,
        bind: Engine,
        handler: Handler,
        *,
        max_sources: int = 100,
        concurrency: int = 1,
        owner: str | None = None,
    ) -> DueStats:
        """Process up to ``max_sources`` due rows with ``handler(row)`` (sync), ``concurrency`` at a time; a
        handler that raises fails its row only. Returns when that many were processed or none is due."""
        if _is_async(handler):
            raise InvalidArgument("the handler is async: run it with await scheduler.arun(...)")
        limit, width, name = self._run_options(max_sources, concurrency, owner)
        stats = DueStats()
        with _Renewer(self, bind) as renewer, ThreadPoolExecutor(width, thread_name_prefix="dibs-due") as pool:
            while stats.claimed < limit:
                held = self._claim_more(bind, name, min(width, limit - stats.claimed))
                if not held:
                    break
                stats.claimed += len(held)
                renewer.hold(held)
                outcomes = list(pool.map(lambda lease: _outcome(handler, lease), held))
                for lease, error in zip(held, outcomes, strict=True):
                    renewer.drop(lease)
                    self._finish(bind, lease, error, stats)
        return stats

    async def arun(
        self,
        bind: Engine,
        handler: Callable[[Row[Any]], Awaitable[Any]] | Handler,
        *,
        max_sources: int = 100,
        concurrency: int = 10,
        owner: str | None = None,
    ) -> DueStats:
        """run() for async handlers (sync ones run in threads): ``concurrency`` handlers at once on the loop;
        database calls go to a thread, one short transaction each."""
        limit, width, name = self._run_options(max_sources, concurrency, owner)
        stats = DueStats()

        async def one(lease: Lease) -> tuple[Lease, BaseException | None]:
            try:
                if _is_async(handler):
                    await handler(lease.row)
                else:
                    result = await asyncio.to_thread(handler, lease.row)
                    if inspect.isawaitable(result):  # a sync callable that hands back a coroutine
                        await result
            except Exception as error:
                return lease, error
            return lease, None

        with _Renewer(self, bind) as renewer:
            while stats.claimed < limit:
                held = await asyncio.to_thread(self._claim_more, bind, name, min(width, limit - stats.claimed))
                if not held:
                    break
                stats.claimed += len(held)
                renewer.hold(held)
                for finished in asyncio.as_completed([one(lease) for lease in held]):
                    lease, error = await finished
                    renewer.drop(lease)
                    await asyncio.to_thread(self._finish, bind, lease, error, stats)
        return stats

    def _claim_more(self, bind: Engine, owner: str, limit: int) -> list[Lease]:
        """A claim for the run loop. An empty one is believed only when no row reads as due: on MySQL and
        MariaDB a claim whose order no index gives locks every due row it sorts until it commits, so a
        second worker's claim meanwhile finds them all taken and returns nothing."""
        for _ in range(_EMPTY_CLAIM_TRIES):
            held = self.claim(bind, owner=owner, limit=limit)
            if held or not self.due_rows(bind, limit=1):
                return held
            time.sleep(0.02)
        return []

    def _run_options(self, max_sources: int, concurrency: int, owner: str | None) -> tuple[int, int, str]:
        limit = whole_number(max_sources)
        width = whole_number(concurrency)
        if limit < 1 or width < 1:
            raise InvalidArgument(
                f"max_sources and concurrency must be at least 1, got {max_sources!r}, {concurrency!r}"
            )
        return limit, width, owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

    def _finish(self, bind: Engine, lease: Lease, error: BaseException | None, stats: DueStats) -> None:
        key = lease.key[0] if len(lease.key) == 1 else lease.key
        if error is None:
            lost = self.done(bind, [lease])
            stats.succeeded += not lost
        else:
            text = f"{type(error).__name__}: {error}"
            formatted = "".join(traceback.format_exception(error))
            lost = self.failed(bind, [lease], f"{text}\n\n{formatted}")
            stats.failed += not lost
            stats.errors[key] = text
        stats.lost += len(lost)


def _is_async(handler: object) -> bool:
    """An async function, or an object whose ``__call__`` is one."""
    method = getattr(type(handler), "__call__", None)  # noqa: B004 - the method itself: is it async?
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(method)


def _outcome(handler: Handler, lease: Lease) -> BaseException | None:
    try:
        result = handler(lease.row)
    except Exception as error:
        return error
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        return InvalidArgument("the handler returned an awaitable, which run() cannot await: use arun()")
    return None


class _Renewer:
    """Renews the leases of rows whose handlers are running, from a thread, every third of the lease."""

    def __init__(self, scheduler: DueScheduler, bind: Engine) -> None:
        self.scheduler = scheduler
        self.bind = bind
        self._held: dict[tuple[Any, ...], Lease] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dibs-due-renewer", daemon=True)

    def __enter__(self) -> _Renewer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def hold(self, leases: Sequence[Lease]) -> None:
        with self._lock:
            self._held.update((lease.key, lease) for lease in leases)

    def drop(self, lease: Lease) -> None:
        with self._lock:
            self._held.pop(lease.key, None)

    def _run(self) -> None:
        while not self._stop.wait(self.scheduler.lease_seconds / 3):
            with self._lock:
                held = list(self._held.values())
            if held:
                try:
                    self.scheduler.leases.renew_many(self.bind, held, self.scheduler.lease_seconds)
                except Exception:  # tried again at the next beat, well before the leases expire
                    continue
