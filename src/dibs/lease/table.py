"""The leased table: its lease columns, their status values, and the statements built for it."""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, NamedTuple

import sqlalchemy as sa

from dibs.claim import column_of, resolve_table

if TYPE_CHECKING:
    from dibs.dialects import ClaimRequest


class LeaseFields(NamedTuple):
    """Where a claimed row holds the key's columns, the token and the expiry."""

    key: tuple[int, ...]
    token: int
    expires_at: int

    @classmethod
    def of(cls, columns: tuple[sa.Column[Any], ...], leases: LeasedTable) -> LeaseFields:
        names = [column.name for column in columns]
        return cls(
            tuple(names.index(column.name) for column in leases.key_columns),
            names.index(leases.token.name),
            names.index(leases.expires_at.name),
        )


class WriteStatements(NamedTuple):
    """The statements of one kind of guarded write, built once."""

    write: sa.Update  # the guarded UPDATE
    returning: sa.Update  # the same, returning the (key..., token) of each row it changed
    held: sa.Select[Any]  # where there is no RETURNING: lock and read the (key..., token) it will change


class LeasedTable:
    """A table with the columns :func:`~dibs.lease_columns` makes (names configurable); see :class:`~dibs.Leases`."""

    def __init__(
        self,
        table: Any,
        *,
        status: str = "status",
        owner: str = "lease_owner",
        expires_at: str = "lease_expires_at",
        token: str = "lease_token",
        attempts: str = "attempts",
        ready: str = "ready",
        running: str = "running",
        done: str = "done",
        failed: str = "failed",
        strategy: str | None = None,
        reclaim_expired: bool = True,
        finished_at: str | None = None,
    ) -> None:
        self.table = resolve_table(table)
        self.strategy = strategy
        #: Whether a claim also takes running rows whose lease expired. Without it the claim reads only
        #: ready rows (an index on them stays small) and :meth:`recover` puts expired rows back.
        self.reclaim_expired = reclaim_expired
        #: A column every finishing write (complete, fail) sets to the database clock, if given.
        self.finished_at = None if finished_at is None else column_of(self.table, finished_at, "Leases(finished_at=)")
        self.status = column_of(self.table, status, "Leases(status=)")
        self.owner = column_of(self.table, owner, "Leases(owner=)")
        self.expires_at = column_of(self.table, expires_at, "Leases(expires_at=)")
        self.token = column_of(self.table, token, "Leases(token=)")
        self.attempts = column_of(self.table, attempts, "Leases(attempts=)")
        self.ready, self.running, self.done, self.failed = ready, running, done, failed
        self.key_columns = tuple(self.table.primary_key.columns)
        self._whole_rows = LeaseFields.of(tuple(self.table.columns), self)
        self._claim_templates: dict[tuple[Any, ...], ClaimRequest] = {}
        #: The same templates by the order_by a caller passed, where that is column names and Columns.
        self._templates_by_argument: dict[tuple[Any, ...], ClaimRequest] = {}
        self._write_templates: OrderedDict[tuple[Any, ...], WriteStatements] = OrderedDict()
