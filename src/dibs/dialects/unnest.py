"""PostgreSQL's batch INSERT: each differing column bound as one JSON array of texts, the whole batch one
statement. JSON, not a ``text[]`` parameter: the driver escapes an array's elements one by one in Python,
the JSON encoder and PostgreSQL's JSON functions do it in C.

::

    WITH dibs_new AS (
        INSERT INTO t (shared..., varying...)
        SELECT <shared expressions>, dibs_rows.v0, ...
        FROM ROWS FROM (json_array_elements_text(CAST(:a0 AS json)), ...)
            WITH ORDINALITY AS dibs_rows(v0, ..., dibs_n) ORDER BY dibs_rows.dibs_n
        RETURNING id, <read columns>)
    SELECT array_agg(id ORDER BY id), min(<read column>)..., pg_notify(<channel>, :dibs_payload) FROM dibs_new

One row comes back whatever the batch's size: the ids as one array, the shared columns once, and the
notification sent in the same round trip (delivered when the transaction commits). A single row takes
``INSERT ... VALUES`` instead, which the planner does less for. On psycopg the statement goes out in
pipeline mode and the caller makes the jobs it returns while the server inserts them: the server's
insert and the Python work per job each take about half of a batch's time, and run on two cores at once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection
from sqlalchemy.sql import ColumnElement

from dibs.dialects import driver
from dibs.dialects.batch import Stored, chunks

_ENCODER = json.JSONEncoder()
#: Rows per statement: bounded so that one statement's arrays stay a few megabytes for small arguments.
ROWS_LIMIT = 65_536
BYTES_LIMIT = 32_000_000
#: The fewest rows whose statement goes out in pipeline mode: entering and leaving it costs about as much
#: Python as making a hundred jobs, so a small batch is sent the plain way.
PIPELINED_ROWS = 128
#: A statement and the columns it returns.
_Built = tuple[sa.Select[Any] | sa.Insert, list[ColumnElement[Any]]]


class ArrayInsert:
    """:class:`~dibs.dialects.batch.BatchInsert` for PostgreSQL."""

    def __init__(
        self,
        table: sa.Table,
        shared: Mapping[str, ColumnElement[Any]],
        varying: Sequence[str],
        read: Sequence[sa.Column[Any]],
        channel: str | None,
    ) -> None:
        self.table, self.shared, self.varying, self.read = table, dict(shared), tuple(varying), tuple(read)
        self.channel = channel
        self._statements: dict[tuple[bool, bool], _Built] = {}

    def _statement(self, single: bool, notify: bool) -> _Built:
        built = self._statements.get((single, notify))
        if built is None:
            built = self._statements[single, notify] = self._build(single, notify and self.channel is not None)
        return built

    def _build(self, single: bool, notify: bool) -> _Built:
        columns = [*self.shared, *self.varying]
        if single:
            insert = sa.insert(self.table).values(
                {**self.shared, **{column: sa.bindparam(f"dibs_{column}") for column in self.varying}}
            )
        else:
            names = [f"v{at}" for at in range(len(self.varying))]
            elements = ", ".join(f"json_array_elements_text(CAST(:dibs_{column} AS json))" for column in self.varying)
            rows = sa.text(
                f"ROWS FROM ({elements}) WITH ORDINALITY AS dibs_rows({', '.join(names)}, dibs_n)"
            ).bindparams(*(sa.bindparam(f"dibs_{column}", type_=sa.String) for column in self.varying))
            elements_of: list[ColumnElement[Any]] = [sa.literal_column(f"dibs_rows.{name}") for name in names]
            source = (
                sa.select(*self.shared.values(), *elements_of)
                .select_from(rows)
                .order_by(sa.literal_column("dibs_rows.dibs_n"))
            )
            insert = sa.insert(self.table).from_select(columns, source)
        returning = insert.returning(self.table.c.id, *self.read)
        if single and not notify:
            return returning, [self.table.c.id, *self.read]
        new = returning.cte("dibs_new")
        if single:
            picked: list[ColumnElement[Any]] = [new.c.id, *(new.c[column.name] for column in self.read)]
        else:
            ordered = postgresql.aggregate_order_by(new.c.id, new.c.id)
            picked = [sa.func.array_agg(ordered), *(sa.func.min(new.c[column.name]) for column in self.read)]
        if notify:
            picked.append(sa.func.pg_notify(self.channel, sa.bindparam("dibs_payload", type_=sa.String)))
        return sa.select(*picked).select_from(new), picked

    def run(
        self,
        conn: Connection,
        parameters: Mapping[str, Any],
        columns: Mapping[str, Sequence[Any]],
        meanwhile: Callable[[], None],
    ) -> list[Stored]:
        found: list[Stored] = []
        waiting: Callable[[], None] | None = meanwhile
        spans = chunks(columns, ROWS_LIMIT, BYTES_LIMIT, powers=False)
        for at, (start, end) in enumerate(spans):
            single = end - start == 1
            # The last statement notifies: the listeners look once the whole batch is in.
            statement, returned = self._statement(single, at == len(spans) - 1 and "dibs_payload" in parameters)
            bound = dict(parameters)
            for column in self.varying:
                values = columns[column]
                bound[f"dibs_{column}"] = values[start] if single else _ENCODER.encode(values[start:end])
            # On the driver's cursor: SQLAlchemy's work around a statement costs more than a one-row INSERT.
            if waiting is None or end - start < PIPELINED_ROWS:
                (row,) = driver.fetch_values(conn, statement, bound, returned)
            else:  # the caller's work while the server inserts the first (most often the only) statement
                (row,) = driver.fetch_values_meanwhile(conn, statement, bound, returned, waiting)
                waiting = None
            ids = [row[0]] if single else list(row[0])
            found.append(Stored(ids, tuple(row[1 : 1 + len(self.read)])))
        if waiting is not None:
            waiting()
        return found
