"""PostgreSQL: one statement that locks, updates and returns, and the database clock.

The claim is::

    WITH dibs_picked AS MATERIALIZED (
        SELECT pk, <order expressions> FROM t WHERE <criteria> ORDER BY ... LIMIT n
        FOR UPDATE OF t SKIP LOCKED)
    UPDATE t SET ... WHERE t.pk = ANY(ARRAY(SELECT pk FROM dibs_picked)) RETURNING t.*

The shorter ``UPDATE t ... WHERE pk IN (SELECT ... LIMIT n FOR UPDATE SKIP LOCKED)`` is wrong: the
planner may rescan that sub-select (a semi-join), and each rescan skips the rows the previous one
locked, so a single call can claim more than n rows under contention. A MATERIALIZED CTE is evaluated
exactly once. Before PostgreSQL 12 every CTE was materialized and the keyword did not exist.

RETURNING comes back in no promised order. When the caller orders by columns the claim returns and
leaves unchanged, of types whose Python values sort as PostgreSQL sorts them (integers, booleans,
dates and times), the rows are sorted in Python. Otherwise the statement carries the pre-update order
values in the CTE, joins the returned rows to them and sorts in SQL, with the database's own collation;
that join and sort cost the server about a seventh of a ten-row claim.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection, Dialect, Engine, Row
from sqlalchemy.sql import ColumnElement
from sqlalchemy.sql.elements import Grouping

from dibs.dialects import driver, psycopg_connection, statistics
from dibs.dialects.backend import BackendDefaults, Listener
from dibs.dialects.batch import BatchInsert
from dibs.dialects.keys import fenced_in_list, fenced_in_list_values
from dibs.dialects.ordering import SortKey, in_order, python_order, split_order
from dibs.dialects.portable import PORTABLE_INSTEAD, PortableClaim
from dibs.dialects.request import ClaimRequest, ClaimStrategy, StatementCache, run_then
from dibs.dialects.transactions import explicit_transaction
from dibs.dialects.unnest import ArrayInsert
from dibs.dialects.versions import server_version, warn_fallback

log = logging.getLogger("dibs.postgresql")

SKIP_LOCKED_SINCE = (9, 5)
#: Column types whose Python values sort as PostgreSQL sorts them. Not text (collations), nor floats and
#: numerics (PostgreSQL sorts NaN above every number; Python cannot sort it at all).
_SORTABLE = (sa.Integer, sa.Boolean, sa.Date, sa.DateTime)
MATERIALIZED_SINCE = (12,)


def _integer(column: sa.Column[Any]) -> bool:
    """Whether the column holds integers, whose JSON object names are what ``column::text`` gives."""
    return isinstance(column.type, sa.Integer) and not isinstance(column.type, sa.Boolean)


class PostgreSQLClaim:
    """One round trip: lock with SKIP LOCKED in a materialized CTE, update, return."""

    name = "postgresql"
    single_statement = True

    def __init__(self, backend: PostgreSQL, *, materialized: bool = True) -> None:
        self.backend = backend
        self.materialized = materialized
        self.statements = StatementCache(self.statement)

    def claim(self, conn: Connection, request: ClaimRequest) -> list[Row[Any]]:
        # The claim alone is one atomic statement, even in autocommit; with more statements after it (then=)
        # it needs a real transaction.
        with conn.begin() if request.then is None else self.backend.transaction(conn):
            (statement, order), reused = self.statements(request), request.shape is not None
            rows = driver.fetch(conn, statement, request.execution(), request.returned, reused=reused)
            return run_then(conn, request, in_order(rows, order) if order else rows)

    def statement(self, request: ClaimRequest) -> tuple[sa.Executable, tuple[SortKey, ...]]:
        """The claim, and how to sort its rows in Python (nothing to do: in order already, or unordered)."""
        table = request.table
        keys = request.key_columns
        in_python = python_order(request, _SORTABLE, text=False, nulls_first_ascending=False)
        orderings = [split_order(clause) for clause in request.order_by] if in_python is None else []
        order_labels = [f"dibs_order_{index}" for index in range(len(orderings))]
        labelled = (expression.label(label) for (expression, _), label in zip(orderings, order_labels, strict=True))
        picked = request.candidates(*keys, *labelled).with_for_update(skip_locked=True, of=table).cte("dibs_picked")
        if self.materialized:
            picked = picked.prefix_with("MATERIALIZED")
        if len(keys) == 1:
            # An array of the picked keys finds the rows by primary-key index; a join with the CTE is often
            # planned as a hash join over a scan of the whole table.
            chosen = keys[0] == sa.func.any(sa.func.array(sa.select(picked.c[keys[0].name]).scalar_subquery()))
        else:
            chosen = sa.tuple_(*keys).in_(sa.select(*(picked.c[key.name] for key in keys)))
        change: sa.Update | sa.Delete = (
            sa.delete(table).where(chosen)
            if request.delete
            else sa.update(table).where(chosen).values(dict(request.values))
        )
        if not orderings:
            return change.returning(*request.returned), in_python or ()
        claimed = change.returning(*request.returned).cte("dibs_claimed")
        ordered = (
            sa.select(*claimed.columns)
            .join_from(claimed, picked, sa.and_(*(claimed.c[key.name] == picked.c[key.name] for key in keys)))
            .order_by(*(reorder(picked.c[label]) for (_, reorder), label in zip(orderings, order_labels, strict=True)))
        )
        return ordered, ()


class PostgreSQL(BackendDefaults):
    """PostgreSQL 9.5 and later natively; older servers fall back to the portable strategy."""

    name = "postgresql"
    async_driver: str | None = "psycopg"
    read_committed: str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED"
    atomic_statements = True
    partial_indexes = True

    def __init__(self) -> None:
        self._notify_statements: dict[str, sa.Select[Any]] = {}

    def native_strategy(self, dialect: Dialect) -> ClaimStrategy:
        version = server_version(dialect)
        if version and version < SKIP_LOCKED_SINCE:
            warn_fallback("PostgreSQL", version, "SKIP LOCKED", SKIP_LOCKED_SINCE, PORTABLE_INSTEAD)
            return PortableClaim(self)
        return PostgreSQLClaim(self, materialized=not version or version >= MATERIALIZED_SINCE)

    def transaction(self, conn: Connection) -> AbstractContextManager[None]:
        # A claim that takes more than one statement runs at READ COMMITTED, whatever the session's level:
        # under REPEATABLE READ a row another worker just claimed makes FOR UPDATE fail instead of skipping.
        return explicit_transaction(conn, ["BEGIN ISOLATION LEVEL READ COMMITTED"], [self.read_committed])

    def utc_value(self, moment: datetime) -> datetime:
        """In UTC with its time zone: dibs's DateTime columns hold time zones on PostgreSQL."""
        return moment.astimezone(timezone.utc)

    @contextlib.contextmanager
    def one_statement(self, conn: Connection, *, owned: bool) -> Iterator[None]:
        # SQLAlchemy's transaction sends nothing in autocommit mode; it marks the statement's bounds.
        with psycopg_connection.autocommit(conn, owned=owned), conn.begin():
            yield

    def now(self) -> ColumnElement[datetime]:
        # The statement's start, not the transaction's (now()): a lease write that joins a caller's long
        # transaction must count from when it runs.
        return sa.func.statement_timestamp(type_=sa.DateTime(timezone=True))

    def after(self, name: str) -> ColumnElement[datetime]:
        return self.now() + sa.bindparam(name, type_=sa.Float) * sa.literal_column(
            "interval '1 second'", type_=sa.Interval()
        )

    def after_value(self, seconds: float) -> Any:
        return float(seconds)

    def elapsed(self, since: ColumnElement[Any], seconds: ColumnElement[Any]) -> ColumnElement[bool]:
        return since <= self.now() - sa.cast(seconds, sa.Float) * sa.literal_column(
            "interval '1 second'", type_=sa.Interval()
        )

    def one_of(self, column: sa.Column[Any], name: str) -> ColumnElement[bool]:
        # ``= ANY(:list)``, not ``IN (:value)``: PostgreSQL turns a one-value IN into ``column = value``, then
        # drops the column from an ORDER BY it leads (it is constant) and may walk the primary key instead of
        # the index led by ``column``, past every row the index leaves out.
        return column == sa.any_(sa.bindparam(name, type_=postgresql.ARRAY(column.type)))

    def fenced(self, key_columns: Sequence[sa.Column[Any]], token: sa.Column[Any]) -> ColumnElement[bool]:
        """``pk = ANY(:keys)``, found by primary key, and each row's token checked against a lookup of its key:
        one statement text for any batch size, with no join whose plan could go wrong. Queue tables change
        faster than their statistics: with a join (or a semi-join) against the arrays the planner, believing
        no row is running, picked nested loops of n x n compares; a row-value IN list of n pairs took
        milliseconds to plan.

        For an integer key the tokens come as one JSON object from key to token, made jsonb once per
        statement (an InitPlan) and read per row by key, a binary search: ``token = ((SELECT
        CAST(:tokens AS JSONB)) ->> pk::text)::bigint``. For other keys, ``token =
        (:tokens)[array_position(:keys, pk)]``, which scans the array for each row: at 1,000 leases that
        cost the completion more than twice the jsonb lookup."""
        if len(key_columns) != 1:
            return fenced_in_list(key_columns, token)
        key = key_columns[0]
        keys = sa.bindparam("dibs_fenced_keys", type_=postgresql.ARRAY(key.type))
        if _integer(key):
            listed = sa.bindparam("dibs_fenced_tokens", type_=sa.String)
            held = sa.select(sa.cast(listed, postgresql.JSONB)).scalar_subquery()
            return sa.and_(key == sa.any_(keys), token == sa.cast(held.op("->>")(sa.cast(key, sa.Text)), token.type))
        tokens = sa.bindparam("dibs_fenced_tokens", type_=postgresql.ARRAY(token.type))
        # The cast matches the array's element type exactly, which array_position needs before PostgreSQL 13.
        position = sa.func.array_position(keys, sa.cast(key, key.type), type_=sa.Integer)
        # Parenthesised, or PostgreSQL reads the subscript as part of the parameter's type cast.
        return sa.and_(key == sa.any_(keys), token == Grouping(tokens)[position])

    def fenced_values(self, key_columns: Sequence[sa.Column[Any]], pairs: Sequence[tuple[Any, ...]]) -> dict[str, Any]:
        if len(key_columns) != 1:
            return fenced_in_list_values(key_columns, pairs)
        # One token per key: tokens only grow, so of two leases on one row only the newer can still hold,
        # and array_position finds the first occurrence of a key.
        newest: dict[Any, Any] = dict(pairs)
        if len(newest) != len(pairs):
            newest = {}
            for key, token in pairs:
                if key not in newest or token > newest[key]:
                    newest[key] = token
        tokens = json.dumps(newest) if _integer(key_columns[0]) else list(newest.values())
        return {"dibs_fenced_keys": list(newest), "dibs_fenced_tokens": tokens}

    def insert_new(self, table: sa.Table, unique: sa.Column[Any]) -> sa.Insert:
        return postgresql.insert(table).on_conflict_do_nothing(index_elements=[unique], index_where=unique.is_not(None))

    def keyed_text(self, name: str, key: sa.Column[Any]) -> ColumnElement[str] | None:
        # As the fenced tokens: made jsonb once per statement (an InitPlan), each row's value found by key.
        values = sa.select(sa.cast(sa.bindparam(name, type_=sa.String), postgresql.JSONB)).scalar_subquery()
        return sa.cast(values.op("->>")(sa.cast(key, sa.Text)), sa.Text)

    def gather_first_statistics(self, conn: Connection, table: sa.Table) -> bool:
        return statistics.gather_first_statistics(conn, table)

    def notify(self, channel: str) -> sa.Executable | None:
        statement = self._notify_statements.get(channel)
        if statement is None:
            payload = sa.bindparam("dibs_payload", type_=sa.String)
            statement = self._notify_statements[channel] = sa.select(sa.func.pg_notify(channel, payload))
        return statement

    def announcing(self, channel: str) -> ColumnElement[Any] | None:
        # A sub-select of nothing from the row is an InitPlan: run once, when the first row that passed the
        # conditions needs its value, and not at all when none does.
        payload = sa.bindparam("dibs_payload", type_=sa.String)
        notified = sa.select(sa.cast(sa.null(), sa.String)).select_from(sa.func.pg_notify(channel, payload))
        return notified.scalar_subquery()

    def batch_insert(
        self,
        dialect: Dialect,
        table: sa.Table,
        shared: Mapping[str, ColumnElement[Any]],
        varying: Sequence[str],
        read: Sequence[sa.Column[Any]],
        channel: str | None,
    ) -> BatchInsert | None:
        return ArrayInsert(table, shared, varying, read, channel)

    def listen(self, engine: Engine, channel: str, woken: Callable[[str], None]) -> Listener | None:
        if engine.dialect.driver != "psycopg":
            return None
        return Notifications(engine, channel, woken)


class Notifications:
    """LISTEN on one channel, on a connection of its own, from a daemon thread.

    The connection is made as the engine makes its own, in a pool of the listener's (so the engine's keeps
    its full size), and closed when listening stops. If the connection drops, the thread reconnects at once
    (then every second while that fails); ``woken("")`` is called when it drops and again once it listens,
    so that a caller looks for what it may have missed.
    """

    def __init__(self, engine: Engine, channel: str, woken: Callable[[str], None]) -> None:
        self.engine = engine
        self.channel = channel
        self.woken = woken
        #: Whether notifications arrive now: False until LISTEN took effect, and while reconnecting.
        self.listening = False
        self._connections = engine.pool.recreate()
        self._stop = threading.Event()
        self._failing = False  # whether the last try to listen failed (said once until it listens again)
        self._since: float | None = None  # when the connection listening now started to, if one does
        self._dropped: str | None = None  # why the last connection dropped, until it listens again
        # A channel of this listener's own, on which close() wakes it at once: a word on the shared channel
        # would wake every other listener of the database too.
        self._wake_channel = f"dibs_wake_{os.getpid()}_{id(self):x}"
        self._thread = threading.Thread(target=self._run, name=f"dibs-listen-{channel}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._listen()
            except Exception as error:
                if self._stop.is_set():
                    break  # the connection closed under a listener that was stopping: nothing was missed
                reason = str(error).splitlines()[0] if str(error) else type(error).__name__
                since, self._since = self._since, None
                if since is not None and time.monotonic() - since >= 1.0:
                    # It listened a while until now (a server restart, an idle timeout): reconnect at once,
                    # and say so only once it listens again, or in a warning if that fails. A connection
                    # that drops as soon as it listens is retried as a failure, a second apart.
                    self._dropped = reason
                    continue
                # Said once an outage, not at every try: callers poll meanwhile, so nothing is lost but time.
                if not self._failing:
                    log.warning("listening on %s failed, polling until it listens again: %s", self.channel, reason)
                self._failing = True
                self._stop.wait(1.0)

    def _listen(self) -> None:
        from psycopg import sql

        # A new connection each time, made as the engine makes its own (its pool's settings and events) but
        # in a pool of the listener's: held for as long as the worker runs, one of the engine's would leave a
        # small pool a connection short (a pool of one: no claim would ever run), and after a server restart
        # the engine's pool would hand out its dead idle connections one by one.
        raw = self._connections.connect()
        conn: Any = raw.driver_connection
        raw.detach()
        try:
            conn.autocommit = True
            # The shared channel last: pg_stat_activity shows a session by its last statement.
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._wake_channel)))
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
            if self._stop.is_set():
                return
            self.listening, self._since = True, time.monotonic()
            self._said_listening_again()
            # Whatever was enqueued while (re)connecting is found by the poll this wake-up triggers.
            self.woken("")
            while not self._stop.is_set():
                # A short timeout: a worker that stops waits for this thread at most this long.
                for notification in conn.notifies(timeout=0.1):
                    if notification.channel != self.channel:
                        break  # close() woke it: the loop sees the stop at once
                    self.woken(notification.payload)
        finally:
            dropped, self.listening = self.listening, False
            conn.close()
            if dropped and not self._stop.is_set():
                # Nothing is heard until the thread reconnects: callers go back to polling meanwhile.
                self.woken("")

    def _said_listening_again(self) -> None:
        """Log that it listens again, after a failure (INFO) or a dropped connection (INFO, with why)."""
        if self._failing:
            log.info("listening on %s again", self.channel)
        elif self._dropped is not None:
            log.info("listening on %s again after its connection dropped: %s", self.channel, self._dropped)
        self._failing, self._dropped = False, None

    def close(self) -> None:
        self._stop.set()
        # Wake the thread out of its wait for notifications instead of letting it time out (up to 0.1 s).
        # On a connection taken out of the pool and closed: a listener may close after its engine was
        # disposed, and a connection given back to that pool would stay open until collected.
        with contextlib.suppress(Exception):
            raw = self.engine.raw_connection()
            raw.detach()
            try:
                cursor = raw.cursor()
                cursor.execute("SELECT pg_notify(%s, '')", (self._wake_channel,))
                raw.commit()
            finally:
                raw.close()
        self._thread.join(timeout=2.0)
