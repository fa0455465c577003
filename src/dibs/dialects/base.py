"""What every dialect module provides, and the pieces of claim SQL that are the same everywhere.

A *backend* knows one database family: how to open a claim transaction, what time it is on the
database, which native claim strategy it has for a given server version, and how to translate the
driver errors dibs understands. A *strategy* turns one :class:`ClaimRequest` into rows.

Statements are built with bind parameters for everything that changes from call to call (the limit,
the picked keys, lease owners and durations) so that a strategy can build them once per claim
*shape* and reuse them: building SQLAlchemy constructs costs more than executing them.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from operator import itemgetter
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect, Engine, Row
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import ColumnElement, operators, visitors
from sqlalchemy.sql.elements import BindParameter
from sqlalchemy.sql.visitors import InternalTraversal

from dibs._errors import FallbackWarning

Then = Callable[[Connection, list[Row[Any]]], object]
S = TypeVar("S")

LIMIT = "dibs_limit"
PICKED = "dibs_picked"


@dataclass(frozen=True, kw_only=True)
class ClaimRequest:
    """One validated claim: which rows, how many, what to do to them, and the values of its parameters.

    Requests with the same ``shape`` (any hashable, None for none) have the same table, criteria,
    values, order and mode, and differ only in ``limit`` and ``parameters``; strategies reuse the
    statements they built for the first of them.
    """

    table: sa.Table
    where: ColumnElement[bool] | None
    values: Mapping[str, Any]
    limit: int
    order_by: tuple[ColumnElement[Any], ...]
    delete: bool
    then: Then | None
    parameters: Mapping[str, Any] = field(default_factory=dict)
    shape: Hashable | None = None
    #: The columns the claimed rows come back with, the key among them; empty for all of the table's.
    columns: tuple[sa.Column[Any], ...] = ()

    #: Worked out from the fields when the request is made; copies made by for_call() share them.
    #: The table's key columns.
    key_columns: tuple[sa.Column[Any], ...] = field(init=False, repr=False, compare=False)
    #: The columns of each claimed row, in order.
    returned: tuple[sa.Column[Any], ...] = field(init=False, repr=False, compare=False)
    #: Where the key's columns stand in a claimed row.
    key_positions: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        derived = self.__dict__  # a frozen dataclass is set up through its __dict__
        derived["key_columns"] = key_columns = tuple(self.table.primary_key.columns)
        derived["returned"] = returned = self.columns or tuple(self.table.columns)
        derived["key_positions"] = positions_of(returned, key_columns)

    def for_call(self, limit: int, parameters: Mapping[str, Any], then: Then | None = None) -> ClaimRequest:
        """This request (a template of its shape) with one call's limit, parameters and ``then``:
        ``dataclasses.replace`` without its keyword handling, a fifth of its time, for a claim loop that
        makes one per call."""
        copied: ClaimRequest = object.__new__(ClaimRequest)
        values = copied.__dict__
        values.update(self.__dict__)
        values["limit"], values["parameters"], values["then"] = limit, parameters, then
        return copied

    def candidates(self, *columns: ColumnElement[Any]) -> sa.Select[Any]:
        """SELECT the given columns of the eligible rows, in claim order, at most ``limit`` of them."""
        query = sa.select(*columns)
        if self.where is not None:
            query = query.where(self.where)
        return query.order_by(*self.order_by).limit(sa.bindparam(LIMIT, type_=sa.Integer))

    def execution(self) -> dict[str, Any]:
        """The parameter values for this request's statements, with times from the application's clock
        taken now: strategies ask for them once their transaction holds its locks."""
        return resolve_times({LIMIT: self.limit, **self.parameters})


class Name(sa.String):
    """A string column that compares byte for byte, trailing spaces included, as dibs's names and keys must.

    PostgreSQL and SQLite compare strings so by default. A backend whose default collation folds case or
    accents, or pads with spaces, gives the column a binary collation when it renders its DDL, and brings
    columns of earlier tables to it in :meth:`Backend.make_names_exact`.
    """


class Constant(ColumnElement[Any]):
    """A value written into the statement's text, as the dialect writes literals, instead of bound: see
    :func:`constant`."""

    __visit_name__ = "dibs_constant"
    inherit_cache = True
    _traverse_internals = [  # noqa: RUF012 (SQLAlchemy declares it so)
        ("value", InternalTraversal.dp_plain_obj),
        ("type", InternalTraversal.dp_type),
    ]

    def __init__(self, value: Any, type_: Any) -> None:
        self.value = value
        self.type = sa.types.to_instance(type_)


@compiles(Constant)
def _render_constant(element: Constant, compiler: Any, **kw: Any) -> str:
    return str(compiler.render_literal_value(element.value, element.type))


def constant(value: str | int) -> ColumnElement[Any]:
    """``value`` in the statement's text: for the states and steps a statement always uses. The planner
    sees them (PostgreSQL keeps one generic plan that can use a partial index on a state; SQLite uses such
    an index only for a query that repeats its literal), and the driver has fewer parameters to send."""
    return Constant(value, sa.String() if isinstance(value, str) else sa.Integer())


class FromNow(NamedTuple):
    """A parameter value: the application's clock ``seconds`` from when the statement runs."""

    seconds: float


def app_now() -> datetime:
    """The application's clock in UTC without tzinfo: how SQLAlchemy stores DateTime where there is no
    database clock it can do arithmetic on."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def resolve_times(parameters: dict[str, Any]) -> dict[str, Any]:
    """Parameters with each :class:`FromNow` turned into a time from the application's clock, now."""
    for name, value in parameters.items():
        if isinstance(value, FromNow):
            parameters[name] = app_now() + timedelta(seconds=value.seconds)
    return parameters


def moment(backend: Backend, seconds: float, name: str = "dibs_moment") -> ColumnElement[datetime]:
    """The database clock ``seconds`` from now (negative: ago) as a SQL expression, its value bound."""
    value = resolve_times({name: backend.after_value(seconds)})[name]

    # What ClauseElement.params() did; SQLAlchemy 2.1 deprecates it on non-statement elements.
    def bind(parameter: BindParameter[Any]) -> None:
        if parameter.key == name:
            parameter.value, parameter.required = value, False

    return visitors.cloned_traverse(backend.after(name), {"maintain_key": True}, {"bindparam": bind})


class ClaimStrategy(Protocol):
    """Claims the rows one request names, inside one transaction it opens and commits itself."""

    name: str
    #: The claim is one statement, atomic without an explicit transaction when there is no ``then``.
    single_statement: bool

    def claim(self, conn: Connection, request: ClaimRequest) -> list[Row[Any]]: ...


class Backend(Protocol):
    """What dibs needs to know about one database family."""

    name: str
    #: A single guarded UPDATE may run in autocommit mode, saving the BEGIN and COMMIT round trips.
    atomic_statements: bool

    def native_strategy(self, dialect: Dialect) -> ClaimStrategy:
        """The fastest correct strategy this server supports (warns when it has to fall back)."""
        ...

    def transaction(self, conn: Connection) -> AbstractContextManager[None]:
        """The transaction a multi-statement claim runs in, opened and committed (or rolled back) here."""
        ...

    def writing(self, conn: Connection) -> AbstractContextManager[Any]:
        """A transaction of dibs's own that writes (an enqueue, a cancel), opened and committed here."""
        ...

    def now(self) -> ColumnElement[datetime]:
        """The current time, as the database sees it, as a SQL expression."""
        ...

    def after(self, name: str) -> ColumnElement[datetime]:
        """The current time plus a number of seconds given at execution, as a SQL expression.

        The value of parameter ``name`` comes from :meth:`after_value`.
        """
        ...

    def after_value(self, seconds: float) -> Any:
        """The value of an :meth:`after` parameter for ``seconds`` from now."""
        ...

    def elapsed(self, since: ColumnElement[Any], seconds: ColumnElement[Any]) -> ColumnElement[bool]:
        """Whether at least ``seconds`` (a SQL expression, per row) have passed since ``since`` on the
        database clock. Raises InvalidArgument where the database has no date arithmetic dibs knows."""
        ...

    def one_of(self, column: sa.Column[Any], name: str) -> ColumnElement[bool]:
        """Whether ``column`` equals one of the values of the list given as parameter ``name`` at execution,
        written so that the planner keeps using an index led by ``column`` for an ORDER BY that starts with
        it, even when the list holds one value."""
        ...

    def translate(self, exc: sa.exc.DBAPIError) -> Exception | None:
        """A dibs error for a driver error dibs understands, else None."""
        ...

    def engine_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """The options for an engine dibs creates, with this backend's defaults added."""
        ...

    def fenced(self, key_columns: Sequence[sa.Column[Any]], token: sa.Column[Any]) -> ColumnElement[bool]:
        """The rows whose (key..., token) is one of the pairs given at execution: the guard of a batched
        lease write. The parameter values come from :meth:`fenced_values`."""
        ...

    def fenced_values(self, key_columns: Sequence[sa.Column[Any]], pairs: Sequence[tuple[Any, ...]]) -> dict[str, Any]:
        """The parameter values of a :meth:`fenced` guard for ``pairs`` of (key..., token)."""
        ...

    def configure(self, engine: Engine) -> None:
        """Tune an engine dibs creates (never one the caller built) for many concurrent claimers."""
        ...

    def insert_new(self, table: sa.Table, unique: sa.Column[Any]) -> sa.Insert:
        """An INSERT that leaves out, without an error, each row whose ``unique`` value is already taken
        (``unique`` has a unique index, partial over its non-NULL values where the database allows).

        It never aborts the caller's transaction, so it can run inside one.
        """
        ...

    def make_names_exact(self, conn: Connection, table: sa.Table) -> None:
        """Bring the :class:`Name` columns of ``table``, made by an earlier dibs, to compare byte for byte
        (nothing where the database's strings always did)."""
        ...

    def notify(self, channel: str) -> sa.Executable | None:
        """A statement that wakes the listeners of ``channel`` when its transaction commits (its
        ``dibs_payload`` parameter is the message), or None where the database cannot."""
        ...

    def listen(self, engine: Engine, channel: str, woken: Callable[[str], None]) -> Listener | None:
        """Start calling ``woken(payload)`` from a thread for every notification on ``channel``; None
        where the database or driver has no notifications (callers then poll)."""
        ...


class Listener(Protocol):
    """A running subscription to database notifications."""

    def close(self) -> None:
        """Stop listening and release the connection."""
        ...


class BackendDefaults:
    """What a backend does unless it says otherwise: no error translation, no engine tuning, and batched
    lease writes guarded by ``pk IN (...) AND (pk, token) IN (...)``."""

    def translate(self, exc: sa.exc.DBAPIError) -> Exception | None:
        return None

    def elapsed(self, since: ColumnElement[Any], seconds: ColumnElement[Any]) -> ColumnElement[bool]:
        from dibs._errors import InvalidArgument

        raise InvalidArgument(
            f"intervals that differ per row need date arithmetic dibs knows only on PostgreSQL, MySQL, MariaDB "
            f"and SQLite, not {getattr(self, 'name', 'this database')}; give the interval as a constant"
        )

    def engine_options(self, options: dict[str, Any]) -> dict[str, Any]:
        return options

    def one_of(self, column: sa.Column[Any], name: str) -> ColumnElement[bool]:
        return column.in_(sa.bindparam(name, expanding=True))

    def configure(self, engine: Engine) -> None:
        return None

    def writing(self, conn: Connection) -> AbstractContextManager[Any]:
        return conn.begin()

    def fenced(self, key_columns: Sequence[sa.Column[Any]], token: sa.Column[Any]) -> ColumnElement[bool]:
        return fenced_in_list(key_columns, token)

    def fenced_values(self, key_columns: Sequence[sa.Column[Any]], pairs: Sequence[tuple[Any, ...]]) -> dict[str, Any]:
        return fenced_in_list_values(key_columns, pairs)

    def insert_new(self, table: sa.Table, unique: sa.Column[Any]) -> sa.Insert:
        # No conflict clause this backend is known to have: a plain INSERT, whose duplicate-key error the
        # caller handles (outside a transaction of its own, where that error is harmless).
        return sa.insert(table)

    def make_names_exact(self, conn: Connection, table: sa.Table) -> None:
        return None

    def notify(self, channel: str) -> sa.Executable | None:
        return None

    def listen(self, engine: Engine, channel: str, woken: Callable[[str], None]) -> Listener | None:
        return None


def server_version(dialect: Dialect) -> tuple[int, ...]:
    """The connected server's version numbers, () before the first connection."""
    numbers: list[int] = []
    for part in dialect.server_version_info or ():
        if not isinstance(part, int):
            break
        numbers.append(part)
    return tuple(numbers)


def warn_fallback(product: str, version: tuple[int, ...], missing: str, since: tuple[int, ...], instead: str) -> None:
    """Say, once per engine, that the server lacks the fast path's feature and what dibs does instead."""
    warnings.warn(
        f"{product} {'.'.join(map(str, version))} has no {missing} ({product} {'.'.join(map(str, since))} "
        f"and later do); dibs {instead}, which is correct but slower.",
        FallbackWarning,
        stacklevel=6,
    )


class StatementCache(Generic[S]):
    """Statements built once per request shape (at most ``size`` shapes, least recently used dropped)."""

    def __init__(self, build: Callable[[ClaimRequest], S], size: int = 256) -> None:
        self._build = build
        self._built: OrderedDict[Hashable, S] = OrderedDict()
        self._size = size

    def __call__(self, request: ClaimRequest) -> S:
        if request.shape is None:
            return self._build(request)
        try:
            self._built.move_to_end(request.shape)
            return self._built[request.shape]
        except KeyError:
            built = self._built[request.shape] = self._build(request)
            if len(self._built) > self._size:
                self._built.popitem(last=False)
            return built


@contextmanager
def explicit_transaction(conn: Connection, begin: Sequence[str], prepare: Sequence[str] = ()) -> Iterator[None]:
    """A transaction on ``conn``: SQLAlchemy's, preceded by the ``prepare`` statements; or, when the driver is
    in autocommit mode and SQLAlchemy's transaction would send nothing, a real one opened with the ``begin``
    statements and ended with an explicit COMMIT or ROLLBACK (asyncio adapters do not end it otherwise)."""
    with conn.begin():
        if not driver_autocommit(conn.connection.dbapi_connection):
            for statement in prepare:
                conn.exec_driver_sql(statement)
            yield
            return
        for statement in begin:
            conn.exec_driver_sql(statement)
        try:
            yield
        except BaseException:
            # The original error is what the caller needs to see. A connection SQLAlchemy has already
            # invalidated (a cancelled task, a lost server) rolled back on its own, when it closed.
            if not conn.invalidated:
                with suppress(Exception):
                    conn.exec_driver_sql("ROLLBACK")
            raise
        conn.exec_driver_sql("COMMIT")


def driver_autocommit(dbapi_connection: Any) -> bool:
    """Whether a driver connection (possibly behind SQLAlchemy's asyncio adapter) is in autocommit mode."""
    for candidate in (dbapi_connection, getattr(dbapi_connection, "_connection", None)):
        get_autocommit = getattr(candidate, "get_autocommit", None)
        state = get_autocommit() if callable(get_autocommit) else getattr(candidate, "autocommit", None)
        if isinstance(state, bool):
            return state
    return False


def positions_of(columns: Sequence[sa.Column[Any]], wanted: Sequence[sa.Column[Any]]) -> tuple[int, ...]:
    """Where each of ``wanted`` stands among ``columns``."""
    names = [column.name for column in columns]
    return tuple(names.index(column.name) for column in wanted)


def key_of(row: Row[Any], positions: Sequence[int]) -> tuple[Any, ...]:
    """The primary key of a whole row of the table, as a tuple, from the key's positions."""
    return tuple(row[position] for position in positions)


def keys_in(key_columns: Sequence[sa.Column[Any]], name: str = PICKED) -> ColumnElement[bool]:
    """``pk IN (:name)`` (``(a, b) IN (:name)`` for composite keys), the list given at execution."""
    target = key_columns[0] if len(key_columns) == 1 else sa.tuple_(*key_columns)
    return target.in_(sa.bindparam(name, expanding=True))


def key_values(key_columns: Sequence[sa.Column[Any]], keys: Sequence[tuple[Any, ...]]) -> list[Any]:
    """The value of a :func:`keys_in` parameter: bare values for a single-column key, tuples otherwise."""
    return [key[0] for key in keys] if len(key_columns) == 1 else list(keys)


def key_equals(key_columns: Sequence[sa.Column[Any]]) -> ColumnElement[bool]:
    """``pk = :dibs_key_0 AND ...``, the key given at execution by :func:`key_parameters`."""
    return sa.and_(*(column == sa.bindparam(f"dibs_key_{index}") for index, column in enumerate(key_columns)))


def key_parameters(key: tuple[Any, ...]) -> dict[str, Any]:
    return {f"dibs_key_{index}": value for index, value in enumerate(key)}


def fenced_in_list(key_columns: Sequence[sa.Column[Any]], token: sa.Column[Any]) -> ColumnElement[bool]:
    """``pk IN (...) AND (pk, token) IN (...)``: the plain key test lets the planner use the primary key."""
    return sa.and_(
        keys_in(key_columns, "dibs_fenced_keys"),
        sa.tuple_(*key_columns, token).in_(sa.bindparam("dibs_fenced_pairs", expanding=True)),
    )


def fenced_in_list_values(key_columns: Sequence[sa.Column[Any]], pairs: Sequence[tuple[Any, ...]]) -> dict[str, Any]:
    key_count = len(key_columns)
    keys = [pair[0] if key_count == 1 else pair[:key_count] for pair in pairs]
    return {"dibs_fenced_keys": keys, "dibs_fenced_pairs": list(pairs)}


def in_key_order(rows: Sequence[Row[Any]], keys: Sequence[tuple[Any, ...]], positions: Sequence[int]) -> list[Row[Any]]:
    """Whole rows sorted by where their key stands in ``keys`` (the order the database picked them in)."""
    order = {key: index for index, key in enumerate(keys)}
    if len(positions) == 1:
        (at,) = positions
        return sorted(rows, key=lambda row: order[(row[at],)])
    return sorted(rows, key=lambda row: order[key_of(row, positions)])


_ORDER_MODIFIERS: dict[Any, Callable[[ColumnElement[Any]], ColumnElement[Any]]] = {
    operators.asc_op: sa.asc,
    operators.desc_op: sa.desc,
    operators.nulls_first_op: sa.nulls_first,
    operators.nulls_last_op: sa.nulls_last,
}


def split_order(
    clause: ColumnElement[Any],
) -> tuple[ColumnElement[Any], Callable[[ColumnElement[Any]], ColumnElement[Any]]]:
    """Split ``expr.desc().nulls_last()`` into ``expr`` and a function that puts the same ordering on another
    expression, so a statement can order its outer query by a value its inner query computed."""
    wrappers: list[Callable[[ColumnElement[Any]], ColumnElement[Any]]] = []
    while isinstance(clause, sa.UnaryExpression) and clause.modifier in _ORDER_MODIFIERS:
        wrappers.append(_ORDER_MODIFIERS[clause.modifier])
        clause = clause.element

    def reorder(expression: ColumnElement[Any]) -> ColumnElement[Any]:
        for wrap in reversed(wrappers):
            expression = wrap(expression)
        return expression

    return clause, reorder


class SortKey(NamedTuple):
    """One ORDER BY term, applied in Python to claimed rows: see :func:`python_order`."""

    position: int  # of the value in a returned row
    descending: bool
    nulls_first: bool


def python_order(
    request: ClaimRequest, sortable: tuple[type, ...], *, text: bool, nulls_first_ascending: bool
) -> tuple[SortKey, ...] | None:
    """How to sort the claimed rows in Python exactly as the request's ORDER BY sorted them, or None where
    Python cannot be sure to: an order by anything but columns the claim returns and does not change, of
    ``sortable`` types (whose Python values sort as the database sorts them), or of text where ``text``
    says the database compares it by code point. ``nulls_first_ascending``: where the database puts NULLs
    in an ascending order that does not say (they go the other way in a descending one)."""
    returned = [column.name for column in request.returned]
    order = []
    for clause in request.order_by:
        element: Any = clause
        descending, nulls_first = False, None
        while isinstance(element, sa.UnaryExpression) and element.modifier is not None:
            if element.modifier is operators.desc_op:
                descending = True
            elif element.modifier in (operators.nulls_first_op, operators.nulls_last_op):
                nulls_first = element.modifier is operators.nulls_first_op
            elif element.modifier is not operators.asc_op:
                return None
            element = element.element
        if not isinstance(element, sa.Column) or element.table is not request.table:
            return None
        plain_text = text and isinstance(element.type, sa.String) and getattr(element.type, "collation", None) is None
        if not (plain_text or isinstance(element.type, sortable)) or type(element.type) is sa.Interval:
            return None
        if element.name in request.values or element.name not in returned:
            return None
        if nulls_first is None:
            nulls_first = nulls_first_ascending != descending
        order.append(SortKey(returned.index(element.name), descending, nulls_first))
    return tuple(order)


def in_order(rows: list[Row[Any]], order: Sequence[SortKey]) -> list[Row[Any]]:
    """Rows sorted by ``order``: one stable sort per key, the last key first."""
    for position, descending, nulls_first in reversed(order):
        present = sorted(
            (row for row in rows if row[position] is not None), key=itemgetter(position), reverse=descending
        )
        absent = [row for row in rows if row[position] is None]
        rows = absent + present if nulls_first else present + absent
    return rows


def run_then(conn: Connection, request: ClaimRequest, rows: list[Row[Any]]) -> list[Row[Any]]:
    """Run the request's ``then`` callback, in the claim's transaction, when something was claimed."""
    if request.then is not None and rows:
        request.then(conn, rows)
    return rows
