"""claim and aclaim: atomically find up to n rows matching a predicate, change them, and return them.

On every backend: no row is returned to two callers for the same eligibility; at most ``limit`` rows
are claimed per call; the returned rows are the rows as stored after ``set``, in ``order_by`` order;
a lost race is a skip, not an error. The claim commits before it returns, so every other worker sees
it at once; that is why it needs an Engine, or a Connection with no transaction open.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, Row
from sqlalchemy.sql import ClauseElement, ColumnElement

from dibs._checks import checked_count
from dibs._errors import InTransaction, InvalidArgument
from dibs.dialects import ClaimRequest, backend_for, psycopg_connection, strategy_for
from dibs.dialects.transactions import checked_out

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

    from dibs.dialects.base import Then

Criteria = ColumnElement[bool] | sa.TextClause | Iterable[ColumnElement[bool]] | None
Ordering = ColumnElement[Any] | str | Iterable[ColumnElement[Any] | str]


def claim(
    bind: Engine | Connection,
    table: Any,
    *,
    where: Criteria = None,
    set: Mapping[Any, Any] | None = None,
    limit: int = 1,
    order_by: Ordering = (),
    delete: bool = False,
    then: Then | None = None,
    strategy: str | None = None,
) -> list[Row[Any]]:
    """Claim up to ``limit`` rows of ``table`` matching ``where``; no row is ever returned to two callers.

    The claim commits before it returns, so every other worker sees it at once; a row another caller is
    claiming at the same moment is skipped, not waited for.

    Args:
        bind: An Engine, or a Connection with no transaction open (the claim commits on its own).
        table: A SQLAlchemy Table, or an ORM mapped class, with a primary key.
        where: The rows that may be claimed: a boolean SQL expression, a list of them (all must hold), or
            None for every row.
        set: What the claim changes: a mapping of column (or column name) to a value or a SQL expression
            (``table.c.attempts + 1``, the database clock). Required unless ``delete``, refused with it.
        limit: The most rows to claim; a limit of 0 or less claims nothing. Never more are claimed,
            whatever the contention.
        order_by: Which rows to claim first, and the order of the returned rows: columns, column names or
            SQL expressions (``table.c.created_at.desc()``).
        delete: Claim by deleting the rows (a consume-once table); they come back as they were.
        then: A function ``then(conn, rows)`` run inside the claim's transaction after the rows are
            claimed, to write more in the same commit; if it raises, nothing is claimed.
        strategy: A claim strategy by name (such as ``"portable"``); None for the database's native one.

    Returns:
        The claimed rows as stored after ``set`` (as they were, with ``delete``), in ``order_by`` order.

    Raises:
        InTransaction: ``bind`` is a Connection inside a transaction; nothing was written.
        InvalidArgument: A bad argument (no set and no delete, or both; a column not in the table; a limit
            that is not a whole number).
        Busy: SQLite stayed locked by another writer past its busy timeout; nothing was claimed.

    Example:
        >>> rows = dibs.claim(
        ...     engine, tasks,
        ...     where=tasks.c.status == "ready",
        ...     set={tasks.c.status: "running"},
        ...     limit=100, order_by=[tasks.c.id],
        ... )
    """
    request = claim_request(table, where=where, values=set, limit=limit, order_by=order_by, delete=delete, then=then)
    return run_claim(bind, request, strategy)


def run_claim(bind: Engine | Connection, request: ClaimRequest, strategy: str | None = None) -> list[Row[Any]]:
    """Run a validated claim on an Engine, or a Connection with no open transaction."""
    if isinstance(bind, Engine):
        if request.limit <= 0:
            return []
        with checked_out(bind, backend_for(bind.dialect).released) as conn:
            return claim_on_connection(conn, request, strategy, owned=True)
    if isinstance(bind, Connection):
        refuse_open_transaction(bind.in_transaction(), "claim")
        return claim_on_connection(bind, request, strategy)
    raise InvalidArgument(
        f"claim() needs a SQLAlchemy Engine or Connection, got {type(bind).__name__}; "
        "for an AsyncEngine or AsyncConnection use aclaim()"
    )


async def aclaim(
    bind: AsyncEngine | AsyncConnection,
    table: Any,
    *,
    where: Criteria = None,
    set: Mapping[Any, Any] | None = None,
    limit: int = 1,
    order_by: Ordering = (),
    delete: bool = False,
    then: Then | None = None,
    strategy: str | None = None,
) -> list[Row[Any]]:
    """:func:`claim` for asyncio: the same statements and guarantees on an AsyncEngine or AsyncConnection.

    Args:
        bind: An AsyncEngine, or an AsyncConnection with no transaction open.
        table: A SQLAlchemy Table, or an ORM mapped class, with a primary key.
        where: The rows that may be claimed: a boolean SQL expression, a list of them (all must hold), or
            None for every row.
        set: What the claim changes: a mapping of column (or column name) to a value or a SQL expression
            (``table.c.attempts + 1``, the database clock). Required unless ``delete``, refused with it.
        limit: The most rows to claim; a limit of 0 or less claims nothing. Never more are claimed,
            whatever the contention.
        order_by: Which rows to claim first, and the order of the returned rows: columns, column names or
            SQL expressions (``table.c.created_at.desc()``).
        delete: Claim by deleting the rows (a consume-once table); they come back as they were.
        then: A function ``then(conn, rows)`` run inside the claim's transaction after the rows are
            claimed, to write more in the same commit; if it raises, nothing is claimed.
            It is a plain function here too: it gets the synchronous face of the connection, so it
            executes statements without awaiting.
        strategy: A claim strategy by name (such as ``"portable"``); None for the database's native one.

    Returns:
        The claimed rows as stored after ``set``, in ``order_by`` order.

    Raises:
        InTransaction: ``bind`` is an AsyncConnection inside a transaction; nothing was written.
        InvalidArgument: A bad argument.
        Busy: SQLite stayed locked by another writer past its busy timeout; nothing was claimed.

    Example:
        >>> rows = await dibs.aclaim(async_engine, tasks, where=tasks.c.status == "ready",
        ...                          set={tasks.c.status: "running"}, limit=10)
    """
    request = claim_request(table, where=where, values=set, limit=limit, order_by=order_by, delete=delete, then=then)
    return await arun_claim(bind, request, strategy)


async def arun_claim(
    bind: AsyncEngine | AsyncConnection, request: ClaimRequest, strategy: str | None = None
) -> list[Row[Any]]:
    """Run a validated claim on an AsyncEngine, or an AsyncConnection with no open transaction."""
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

    if isinstance(bind, AsyncEngine):
        if request.limit <= 0:
            return []
        async with bind.connect() as conn:
            return await conn.run_sync(claim_on_connection, request, strategy, owned=True)
    if isinstance(bind, AsyncConnection):
        refuse_open_transaction(bind.in_transaction(), "aclaim")
        return await bind.run_sync(claim_on_connection, request, strategy)
    raise InvalidArgument(
        f"aclaim() needs a SQLAlchemy AsyncEngine or AsyncConnection, got {type(bind).__name__}; "
        "for an Engine or Connection use claim()"
    )


def claim_on_connection(
    conn: Connection, request: ClaimRequest, strategy: str | None = None, *, owned: bool = False
) -> list[Row[Any]]:
    """Run a validated claim on a connection with no open transaction, translating backend errors.

    ``owned``: dibs checked the connection out itself, so it may set the connection's options.
    """
    if request.limit <= 0:
        return []
    chosen = strategy_for(conn.dialect, strategy)
    try:
        if chosen.single_statement and request.then is None:
            # One statement is atomic on its own: without BEGIN and COMMIT it costs one round trip, not three.
            with psycopg_connection.autocommit(conn, owned=owned):
                return chosen.claim(conn, request)
        return chosen.claim(conn, request)
    except sa.exc.DBAPIError as exc:
        translated = backend_for(conn.dialect).translate(exc)
        if translated is None:
            raise
        raise translated from exc


def refuse_open_transaction(in_transaction: bool, caller: str) -> None:
    if in_transaction:
        raise InTransaction(
            f"{caller}() was called inside an open transaction on this connection; a claim commits on its "
            "own so that other workers see it at once. Call it on an Engine or on a connection with no "
            "transaction (commit or roll back first), and use then= to run more statements atomically "
            "with the claim."
        )


def resolve_table(table: Any) -> sa.Table:
    """A Table from a Table or an ORM mapped class, with a primary key."""
    resolved: Any = table
    if not isinstance(table, sa.Table):
        inspected = sa.inspect(table, raiseerr=False)
        resolved = getattr(inspected, "local_table", None)
    if not isinstance(resolved, sa.Table):
        raise InvalidArgument(
            f"expected a SQLAlchemy Table or an ORM mapped class, got {table!r}; pass the Table object "
            "(metadata.tables['name']) or the mapped class"
        )
    if not resolved.primary_key.columns:
        raise InvalidArgument(
            f"table {resolved.name!r} has no primary key; dibs tells rows apart by it. Declare one "
            "(primary_key=True on the identifying columns) in the Table definition."
        )
    return resolved


def column_of(table: sa.Table, column: Any, purpose: str) -> sa.Column[Any]:
    """The column of ``table`` named or given by ``column``, or a clear error."""
    if hasattr(column, "__clause_element__"):  # an ORM attribute such as Job.status
        column = column.__clause_element__()
    if isinstance(column, str):
        found = table.c.get(column)
        if found is not None:
            return found
    elif isinstance(column, sa.Column) and column.table is table:
        return column
    elif isinstance(column, ColumnElement):
        found = table.c.get(getattr(column, "key", ""))
        if found is not None and column.compare(found):
            return found
    known = ", ".join(sorted(table.c.keys()))
    raise InvalidArgument(
        f"{purpose} names {column!r}, which is not a column of table {table.name!r}; its columns are: {known}"
    )


def claim_request(
    table: Any,
    *,
    where: Criteria,
    values: Mapping[Any, Any] | None,
    limit: Any,
    order_by: Ordering,
    delete: bool,
    then: Then | None,
) -> ClaimRequest:
    """Check every argument of a claim and build the request; raises InvalidArgument before any I/O."""
    resolved = resolve_table(table)
    count = whole_number(limit)
    if delete and values:
        raise InvalidArgument("claim() takes either set= (claim by updating) or delete=True, not both")
    if not delete and not values:
        raise InvalidArgument(
            "claim() needs set= with the change that marks rows as claimed (for example "
            "{'status': 'running'}), so that the next claim skips them; or delete=True to claim by deleting"
        )
    if then is not None and not callable(then):
        raise InvalidArgument(f"then must be a callable taking (connection, rows), got {then!r}")
    return ClaimRequest(
        table=resolved,
        where=_criteria(where),
        values=_changes(resolved, values),
        limit=count,
        order_by=ordering(resolved, order_by),
        delete=bool(delete),
        then=then,
    )


def _changes(table: sa.Table, values: Mapping[Any, Any] | None) -> dict[str, Any]:
    """What ``set=`` changes, by column name; the primary key is not among them: the claimed rows are read
    back by it."""
    if values is not None and not isinstance(values, Mapping):
        raise InvalidArgument(f"set must be a mapping of column (or name) to value, such as {{'status': 'running'}}, "
                              f"got {values!r}")  # fmt: skip
    changes = {column_of(table, key, "set").name: value for key, value in (values or {}).items()}
    keys = [name for name in changes if table.c[name].primary_key]
    if keys:
        raise InvalidArgument(
            f"set changes the primary key ({', '.join(keys)}), by which the claimed rows are read back; "
            "claim by another column, then change the key in then= or afterwards"
        )
    return changes


def whole_number(limit: Any, name: str = "limit") -> int:
    """A claim limit (or another count of rows, called ``name``) as an int: at most MOST_ROWS, and claiming
    nothing when not positive; InvalidArgument otherwise."""
    return checked_count(limit, name, minimum=None)


def _criteria(where: Criteria) -> ColumnElement[bool] | None:
    if where is None:
        return None
    if isinstance(where, str):
        raise InvalidArgument(
            "where must be a SQL expression such as table.c.status == 'ready'; "
            "wrap raw SQL in sqlalchemy.text() if you must"
        )
    if isinstance(where, ClauseElement):
        return sa.and_(where)
    if not isinstance(where, Iterable):
        raise InvalidArgument(f"where must be a SQL expression or a list of them, got {where!r}")
    parts = list(where)
    for part in parts:
        if not isinstance(part, ClauseElement):
            raise InvalidArgument(f"where must hold SQL expressions, got {part!r}")
    return sa.and_(*parts) if parts else None


def ordering(table: sa.Table, order_by: Ordering) -> tuple[ColumnElement[Any], ...]:
    single = isinstance(order_by, (str, ClauseElement)) or hasattr(order_by, "__clause_element__")
    if not single and not isinstance(order_by, Iterable):
        raise InvalidArgument(f"order_by must be a column name, a SQL expression or a list of them, got {order_by!r}")
    items: Iterable[Any] = [order_by] if single else order_by
    ordering: list[ColumnElement[Any]] = []
    for item in items:
        if hasattr(item, "__clause_element__"):
            item = item.__clause_element__()
        if isinstance(item, str):
            ordering.append(column_of(table, item, "order_by"))
        elif isinstance(item, ColumnElement):
            ordering.append(item)
        else:
            raise InvalidArgument(f"order_by must hold column names or SQL expressions, got {item!r}")
    return tuple(ordering)
