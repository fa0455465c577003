"""The tables the conformance suite claims from."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

import dibs

if TYPE_CHECKING:
    from tests.helpers.harness import Harness


def work_columns() -> list[Any]:
    """A work table: an id, a status, a priority that may be NULL, a counter, and who claimed the row."""
    return [
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("status", sa.String(20), nullable=False, server_default="ready"),
        sa.Column("priority", sa.Integer, nullable=True),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("claimed_by", sa.String(64), nullable=True),
        sa.Column("payload", sa.String(100), nullable=True),
    ]


def leased_columns() -> list[Any]:
    """A table with fenced-lease columns."""
    return [
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("payload", sa.String(100), nullable=True),
        *dibs.lease_columns(),
    ]


def fill(table: sa.Table, count: int, **values: Any) -> list[dict[str, Any]]:
    """Rows 1..count with the given values (a callable gets the id)."""
    return [
        {"id": i, **{name: value(i) if callable(value) else value for name, value in values.items()}}
        for i in range(1, count + 1)
    ]


def make_leased(db: Harness, count: int) -> tuple[sa.Table, dibs.Leases]:
    table = db.table("leased", *leased_columns())
    db.execute(table.insert(), fill(table, count, payload=lambda i: f"p{i}"))
    return table, db.leases(table)
