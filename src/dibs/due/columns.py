"""The due scheduler's own columns on the user's table: made for a new Table, or added to an existing one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dibs._errors import InvalidArgument
from dibs.claim import resolve_table
from dibs.schema import Timestamp

#: A row's lease status: idle (waiting until it is due) or running (a worker holds it).
IDLE, RUNNING = "idle", "running"

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
    """Fresh columns the due scheduler needs, to add to a Table definition.

    Args:
        **names: Other names for the columns, by the keys of :data:`DUE_COLUMN_NAMES`.

    Returns:
        A lease status, owner, expiry and token, a run count, and the last error.

    Raises:
        InvalidArgument: For a key that names no column of the scheduler.

    Example:
        >>> feeds = sa.Table("feeds", metadata, sa.Column("id", sa.Integer, primary_key=True), *dibs.due_columns())
    """
    chosen = column_names(names)
    return [
        sa.Column(chosen["status"], sa.String(16), nullable=False, server_default=IDLE),
        sa.Column(chosen["owner"], sa.String(200), nullable=True),
        sa.Column(chosen["expires_at"], Timestamp, nullable=True),
        sa.Column(chosen["token"], sa.BigInteger, nullable=False, server_default="0"),
        sa.Column(chosen["runs"], sa.Integer, nullable=False, server_default="0"),
        sa.Column(chosen["last_error"], sa.Text, nullable=True),
    ]


def add_due_columns(bind: Engine, table: Any, **names: str) -> list[str]:
    """Add the scheduler's columns that ``table`` lacks, in the database (ALTER TABLE ... ADD COLUMN) and on the
    Table object; safe to run at every start: it changes nothing when they are all there.

    Args:
        bind: The database the table is in.
        table: A Table, or an ORM class mapped to one.
        **names: Other names for the columns, as :func:`due_columns` takes them.

    Returns:
        The names of the columns added to the database.
    """
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


def column_names(names: Mapping[str, str]) -> dict[str, str]:
    """The scheduler's column names, the defaults overridden by ``names``; InvalidArgument for an unknown key."""
    unknown = set(names) - set(DUE_COLUMN_NAMES)
    if unknown:
        raise InvalidArgument(
            f"unknown scheduler column(s) {sorted(unknown)}; the names that can be changed are "
            f"{', '.join(DUE_COLUMN_NAMES)}"
        )
    return {**DUE_COLUMN_NAMES, **names}
