"""Many rows in few INSERTs that give back the ids made, in the order of the rows.

The rows of a batch differ in a few columns (a job's arguments, its ordering key) and share the rest (one
value or SQL expression for all of them), so only the differing columns cost anything per row. PostgreSQL
takes each differing column as one array (``INSERT ... SELECT ... FROM unnest(...) WITH ORDINALITY``),
elsewhere a multi-row ``VALUES`` binds the differing values of a row and repeats the shared ones.

Ids come from a sequence (or rowid, or AUTO_INCREMENT) in the order the rows are inserted, and the rows are
inserted in the order given, so the returned ids sorted are the rows' ids in order. Shared expressions that
read the clock give the same value for every row of one statement, so each statement's shared columns are
read back once, not per row.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from itertools import islice
from typing import Any, NamedTuple, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.sql import ColumnElement

from dibs._errors import InvalidArgument
from dibs.dialects import driver

#: The largest statement of a batch, by rows and by the bytes of its differing text values.
ROWS_LIMIT = 512
BYTES_LIMIT = 4_000_000
#: Parameters a statement may bind, where the database says nothing lower.
PARAMETERS_LIMIT = 32_766


class Stored(NamedTuple):
    """What one statement of a batch stored: the ids made, in the order of its rows, and the ``read``
    columns (the same for every row of the statement) as stored."""

    ids: list[int]
    shared: tuple[Any, ...]


class BatchInsert(Protocol):
    """An INSERT of many rows, built once per shape and run for every batch of that shape."""

    def run(
        self,
        conn: Connection,
        parameters: Mapping[str, Any],
        columns: Mapping[str, Sequence[Any]],
        meanwhile: Callable[[], None],
    ) -> list[Stored]:
        """Insert one row per value of ``columns`` (each the same length), with ``parameters`` bound for the
        shared expressions, on ``conn`` in its transaction; ``meanwhile`` (Python work that does not use
        ``conn``) is called once, while the database inserts where the driver allows."""
        ...


def chunks(
    columns: Mapping[str, Sequence[Any]], rows: int, size_bytes: int = BYTES_LIMIT, *, powers: bool = True
) -> list[tuple[int, int]]:
    """(start, end) of each statement's rows: at most ``rows`` and about ``size_bytes`` of text; with
    ``powers``, each a power of two rows (``rows`` is one), so that a batch of any size takes one of a few
    statements, each built once."""
    total = len(next(iter(columns.values())))
    texts = [values for values in columns.values() if any(isinstance(value, str) for value in values[:1])]
    found: list[tuple[int, int]] = []
    start = 0
    while start < total:
        size = rows
        while size > total - start:
            size = size // 2 if powers else total - start
        while size > 1 and _text_bytes(texts, start, start + size) > size_bytes:
            size //= 2
        found.append((start, start + size))
        start += size
    return found


def _text_bytes(texts: Sequence[Sequence[str | None]], start: int, end: int) -> int:
    return sum(sum(map(len, filter(None, islice(values, start, end)))) for values in texts)


#: A named parameter in the SQL of the drivers that take them by name.
_NAMED = {"pyformat": re.compile(r"%\((\w+)\)s"), "named": re.compile(r"(?<![:\w]):(\w+)")}
_POSITIONAL = {"pyformat": "%s", "named": "?"}


def _positional(compiled: Any, paramstyle: str) -> tuple[str, list[str]]:
    """The SQL of a compiled statement with parameters by position, and the name of each position."""
    if compiled.positiontup is not None:
        return str(compiled.string), list(compiled.positiontup)
    names: list[str] = []

    def position(found: re.Match[str]) -> str:
        names.append(found.group(1))
        return _POSITIONAL[paramstyle]

    return _NAMED[paramstyle].sub(position, compiled.string), names


class ValuesInsert:
    """Multi-row ``INSERT ... VALUES ... RETURNING id``: the one-row statement compiled once, its ``VALUES``
    group repeated for each row count (a power of two) and run with the driver's own parameters."""

    def __init__(
        self,
        table: sa.Table,
        shared: Mapping[str, ColumnElement[Any]],
        varying: Sequence[str],
        read: Sequence[sa.Column[Any]],
        parameters_limit: int = PARAMETERS_LIMIT,
    ) -> None:
        self.table, self.varying, self.read = table, tuple(varying), tuple(read)
        values = {
            **shared,
            **{column: sa.bindparam(f"dibs_{column}", type_=table.c[column].type) for column in varying},
        }
        #: One row gives its shared columns back with its id: one round trip for a job enqueued alone.
        self._single_columns = [table.c.id, *self.read]
        self.single = sa.insert(table).values(values).returning(*self._single_columns)
        self._one_row = self._many_rows(shared, values)
        self._read = sa.select(*self.read).where(table.c.id == sa.bindparam("dibs_first_id"))
        self._compiled: Any = None
        self._sql: dict[int, str] = {}
        self.parameters_limit = parameters_limit

    def _many_rows(self, shared: Mapping[str, ColumnElement[Any]], values: Mapping[str, Any]) -> sa.Insert:
        """The statement of one row whose rows part :meth:`_statement` repeats."""
        return sa.insert(self.table).values(values).returning(self.table.c.id)

    def _prepare(self, conn: Connection) -> Any:
        if self._compiled is None:
            check_paramstyle(conn.dialect)  # a caller's connection of such an engine (conn=, a Session)
            compiled = self._one_row.compile(dialect=conn.dialect)
            sql, self._names = _positional(compiled, conn.dialect.paramstyle)
            self._parts = self._split(sql, conn.dialect.paramstyle)
            self._rows = ROWS_LIMIT
            while self._rows > 1 and self._parameters(self._rows) > self.parameters_limit:
                self._rows //= 2
            self._compiled = compiled
        return self._compiled

    def _split(self, sql: str, paramstyle: str) -> tuple[str, str, str]:
        """The one-row statement as what comes before its rows, one row, and what comes after them."""
        head, _, rest = sql.partition(" VALUES ")
        group, _, tail = rest.rpartition(" RETURNING ")
        return f"{head} VALUES ", group, f" RETURNING {tail}"

    def _parameters(self, rows: int) -> int:
        """The parameters a statement of ``rows`` rows binds."""
        return rows * len(self._names)

    def _statement(self, rows: int) -> str:
        sql = self._sql.get(rows)
        if sql is None:
            head, group, tail = self._parts
            sql = self._sql[rows] = head + ", ".join([group] * rows) + tail
        return sql

    def _processor(self, conn: Connection, column: str) -> Any:
        return self.table.c[column].type.dialect_impl(conn.dialect).bind_processor(conn.dialect)

    def _shared(self, conn: Connection, compiled: Any, parameters: Mapping[str, Any]) -> dict[str, Any]:
        """The driver's value of each shared parameter, by name."""
        shared = {}
        for name in self._names:
            if name.startswith("dibs_") and name[5:] in self.varying:
                continue
            value = parameters[name] if name in parameters else compiled.binds[name].effective_value
            processor = compiled.binds[name].type.dialect_impl(conn.dialect).bind_processor(conn.dialect)
            shared[name] = value if processor is None else processor(value)
        return shared

    def _bound(
        self, conn: Connection, shared: Mapping[str, Any], columns: Mapping[str, Sequence[Any]], start: int, end: int
    ) -> list[Any]:
        """The parameters of the statement of rows ``start`` to ``end``: each row's shared values and its own."""
        width = len(self._names)
        flat = [shared.get(name) for name in self._names] * (end - start)
        for column in self.varying:
            values, processor = columns[column][start:end], self._processor(conn, column)
            flat[self._names.index(f"dibs_{column}") :: width] = (
                values if processor is None else list(map(processor, values))
            )
        return flat

    def run(
        self,
        conn: Connection,
        parameters: Mapping[str, Any],
        columns: Mapping[str, Sequence[Any]],
        meanwhile: Callable[[], None],
    ) -> list[Stored]:
        meanwhile()
        if len(next(iter(columns.values()))) == 1:
            bound = {**parameters, **{f"dibs_{column}": columns[column][0] for column in self.varying}}
            (row,) = driver.fetch_values(conn, self.single, bound, self._single_columns)
            return [Stored([row[0]], tuple(row[1:]))]
        compiled = self._prepare(conn)
        shared = self._shared(conn, compiled, parameters)
        found: list[Stored] = []
        for start, end in chunks(columns, self._rows):
            flat = self._bound(conn, shared, columns, start, end)
            ids = sorted(row[0] for row in driver.fetch_text(conn, self._statement(end - start), flat))
            found.append(Stored(ids, tuple(conn.execute(self._read, {"dibs_first_id": ids[0]}).one())))
        return found


#: The stand-in for the rows of a :class:`SelectedValuesInsert`, replaced by their ``VALUES`` list.
_ROWS = "dibs_rows"
#: A positional parameter in each paramstyle a :class:`SelectedValuesInsert` is compiled to.
_MARKS = {"qmark": "?", "named": "?", "format": "%s", "pyformat": "%s"}


def check_paramstyle(dialect: sa.Dialect) -> None:
    """InvalidArgument, saying what to change, if dibs cannot run its statements in the dialect's paramstyle.

    ``numeric`` (``:1``, which pysqlite takes when asked for it) is refused: SQLAlchemy numbers the
    parameters of some of its own statements out of the order the driver binds them in, and the multi-row
    INSERTs of a batch (:class:`ValuesInsert`) are written in the marks of the other styles. PostgreSQL's
    ``numeric_dollar`` (asyncpg's ``$1``) works: its batches are one statement SQLAlchemy compiles."""
    style = dialect.paramstyle
    if style != "numeric" and (style in _MARKS or dialect.name == "postgresql"):
        return
    raise InvalidArgument(
        f"the engine binds parameters in the {style!r} paramstyle, which dibs does not write its statements in; "
        f"make it without paramstyle= (the driver's default, {dialect.loaded_dbapi.paramstyle!r}), or with "
        f"{', '.join(map(repr, _MARKS))} where the driver takes it"
    )


class SelectedValuesInsert(ValuesInsert):
    """``INSERT ... SELECT <shared>, column1, ... FROM (VALUES (?), (?), ...) RETURNING id``: the shared
    values bound once per statement and each row binding only its own. On SQLite, binding a row's dozen
    shared values cost more than inserting it (5.4 against 3.5 us a row for 20,000 jobs); SQLite names
    the columns of a ``VALUES`` list column1, column2, ... and reads its rows in order."""

    def _many_rows(self, shared: Mapping[str, ColumnElement[Any]], values: Mapping[str, Any]) -> sa.Insert:
        rows = sa.table(_ROWS, *[sa.column(f"column{index}") for index in range(1, len(self.varying) + 1)])
        selected = sa.select(*shared.values(), *rows.c).select_from(rows)
        return sa.insert(self.table).from_select([*shared, *self.varying], selected).returning(self.table.c.id)

    def _split(self, sql: str, paramstyle: str) -> tuple[str, str, str]:
        parts = re.split(rf"\s+FROM {_ROWS}\b", sql)
        if len(parts) != 2:
            raise AssertionError(f"no rows to stand in for in {sql!r}")
        head, tail = parts
        group = "(" + ", ".join([_MARKS[paramstyle]] * len(self.varying)) + ")"
        return f"{head} FROM (VALUES ", group, f") AS {_ROWS}{tail}"

    def _parameters(self, rows: int) -> int:
        return rows * len(self.varying) + len(self._names)

    def _bound(
        self, conn: Connection, shared: Mapping[str, Any], columns: Mapping[str, Sequence[Any]], start: int, end: int
    ) -> list[Any]:
        width = len(self.varying)
        flat = [shared[name] for name in self._names] + [None] * ((end - start) * width)
        head = len(self._names)
        for offset, column in enumerate(self.varying):
            values, processor = columns[column][start:end], self._processor(conn, column)
            flat[head + offset :: width] = values if processor is None else list(map(processor, values))
        return flat
