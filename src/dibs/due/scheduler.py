"""The due scheduler: many workers take the due rows of the user's own table (feeds, syncs, crawls), each row
by one worker at a time, holding a lease instead of a row lock while its handler does slow I/O.

A row is due when it is enabled and ``last_run IS NULL OR last_run <= now - interval`` on the database
clock, with the interval a constant, a column (seconds or minutes) or any SQL expression in seconds.
Due rows are taken by priority (highest first), then oldest last run first, never-run rows before all;
the limit applies after the due test. Each claimed row gets a fenced lease; its handler runs with no
transaction open; then the row is completed (``last_run = now``), failed (its error kept, and due
again by the normal rule, or after ``retry_after``) or released. A worker that dies leaves its rows
to be taken again when their leases expire.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine, Row

from dibs._checks import checked_count, checked_seconds
from dibs._errors import InvalidArgument
from dibs.claim import column_of, resolve_table, whole_number
from dibs.dialects import Backend, backend_for
from dibs.dialects.base import from_now
from dibs.due.columns import IDLE, RUNNING, column_names
from dibs.due.runner import AsyncHandler, DueRunner, DueStats, Handler
from dibs.lease import Claimer, Duration, Lease, Leases

#: Errors are kept up to this many characters: the last-error column is the user's own TEXT, which MySQL caps
#: at 64 KiB, so four-byte characters must fit (the dibs tables use a longer type and keep more).
ERROR_LIMIT = 10_000
_RETRY_AFTER = "dibs_retry_after"
_DUE_CUTOFF = "dibs_due_cutoff"

Interval = Duration | str | sa.ColumnElement[Any]


def _interval(table: sa.Table, interval: Interval, unit: str) -> tuple[float | None, sa.ColumnElement[Any] | None]:
    """The interval as constant seconds, or as an SQL expression in seconds (the other one None)."""
    if unit not in ("seconds", "minutes"):
        raise InvalidArgument(f"interval_unit must be 'seconds' or 'minutes', got {unit!r}")
    if unit != "seconds" and not isinstance(interval, (str, sa.Column)):
        raise InvalidArgument(
            f"interval_unit={unit!r} applies to an interval column only; give a constant as a "
            "timedelta (timedelta(minutes=5)) and an expression in seconds"
        )
    if isinstance(interval, (timedelta, int, float)) and not isinstance(interval, bool):
        return checked_seconds(interval, "interval"), None
    if isinstance(interval, (str, sa.Column)):
        column = column_of(table, interval, "DueScheduler(interval=)")
        return None, column * 60 if unit == "minutes" else column
    if isinstance(interval, sa.ColumnElement):
        return None, interval
    raise InvalidArgument(
        "interval must be a timedelta or seconds (the same for every row), a column name or Column "
        f"(per row), or a SQL expression in seconds; got {interval!r}"
    )


def _own_columns(table: sa.Table, names: dict[str, str], strategy: str | None) -> tuple[Leases, sa.Column[Any]]:
    """The fenced leases on the scheduler's own columns, and its last-error column; InvalidArgument saying how to
    add them if one is missing."""
    try:
        last_error = column_of(table, names["last_error"], "DueScheduler(last_error=)")
        leases = Leases(
            table,
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
            f"{exc}. The due scheduler needs its own columns on {table.name}: add them with "
            "dibs.add_due_columns(engine, table) (or dibs.due_columns() in a new Table definition)"
        ) from exc
    return leases, last_error


class DueScheduler:
    """Takes due rows of a table with fenced leases: each due row by one worker at a time.

    Args:
        table: A Table, or an ORM class mapped to one, with a primary key.
        last_run: The column of the last run's time.
        interval: A timedelta or number of seconds (the same for every row), a column name or Column (per row,
            in ``interval_unit``), or any SQL expression giving seconds.
        interval_unit: ``seconds`` or ``minutes``, for an interval column.
        enabled: A boolean column; rows where it is false are never due.
        priority: A column; higher goes first.
        lease: How long a claimed row is held (renewed while its handler runs).
        retry_after: After a failure, due again this long after it (default: by the normal due rule, one
            interval after the failed run).
        strategy: The claim strategy, as :class:`~dibs.Leases` takes it (default: the database's best).
        **columns: Other names for the scheduler's own columns (see :func:`~dibs.due_columns`).

    Raises:
        InvalidArgument: For a column the table lacks, or an interval, lease or unit out of range.

    Example:
        >>> scheduler = dibs.DueScheduler(feeds, interval="every_minutes", interval_unit="minutes")
        >>> stats = scheduler.run(engine, fetch_feed, max_sources=50, concurrency=8)
    """

    def __init__(
        self,
        table: Any,
        *,
        last_run: str | sa.Column[Any] = "last_run_at",
        interval: Interval,
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
        self.constant_interval, self.interval_seconds = _interval(self.table, interval, interval_unit)
        self.lease_seconds = checked_seconds(lease, "lease")
        self.retry_after = None if retry_after is None else checked_seconds(retry_after, "retry_after")
        names = column_names(columns)
        self.leases, self.last_error = _own_columns(self.table, names, strategy)
        self._claimers: dict[str, Claimer] = {}
        # The clock expressions of the writes, one per database: a write is built once per expression.
        self._clocks: dict[str, tuple[Any, Any]] = {}

    # -- the due test ------------------------------------------------------------------------------

    def due(self, bind: Engine) -> list[sa.ColumnElement[bool]]:
        """The criteria of a due row on ``bind``'s database, as SQL, evaluated on the database clock now."""
        backend = backend_for(bind.dialect)
        cutoff = None if self.constant_interval is None else from_now(backend, -self.constant_interval, _DUE_CUTOFF)
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

    def complete(self, bind: Engine, held: Sequence[Lease]) -> list[Lease]:
        """Record rows as run now: ``last_run`` set to the database clock, the last error cleared.

        Args:
            bind: The database of the table.
            held: The leases of the rows, as :meth:`claim` gave them.

        Returns:
            The leases that were lost (taken over or finished already): their rows were not changed.
        """
        now, _ = self._clock(bind)
        return self.leases.complete_many(bind, held, set={self.last_run: now, self.last_error: None})

    def fail(self, bind: Engine, held: Sequence[Lease], error: str) -> list[Lease]:
        """Record a failed run: the error kept, and the row due again by the normal rule (``last_run`` = now) or,
        with ``retry_after``, that long from now.

        Args:
            bind: The database of the table.
            held: The leases of the rows, as :meth:`claim` gave them.
            error: What went wrong, kept in the last-error column (cut to :data:`ERROR_LIMIT` characters).

        Returns:
            The leases that were lost (taken over or finished already): their rows were not changed.
        """
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
        handler that raises fails its row only.

        Args:
            bind: The database of the table.
            handler: Called with each claimed row, in a thread, with no transaction open.
            max_sources: The most rows processed in this run.
            concurrency: Handlers running at once.
            owner: The lease owner name (default: host, process id and a random part).

        Returns:
            What the run did, once that many rows were processed or none is due.

        Raises:
            InvalidArgument: For an async handler (use :meth:`arun`) or a limit below 1.
        """
        runner = DueRunner(self, bind, max_sources=max_sources, concurrency=concurrency, owner=owner)
        return runner.run(handler)

    async def arun(
        self,
        bind: Engine,
        handler: AsyncHandler | Handler,
        *,
        max_sources: int = 100,
        concurrency: int = 10,
        owner: str | None = None,
    ) -> DueStats:
        """:meth:`run` for async handlers (sync ones run in threads): ``concurrency`` handlers at once on the
        loop; database calls go to a thread, one short transaction each.

        Returns:
            What the run did, once ``max_sources`` rows were processed or none is due.
        """
        runner = DueRunner(self, bind, max_sources=max_sources, concurrency=concurrency, owner=owner)
        return await runner.arun(handler)
