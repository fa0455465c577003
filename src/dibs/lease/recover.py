"""Putting back rows whose lease expired (:meth:`dibs.Leases.recover`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dibs._errors import InvalidArgument
from dibs.claim import Criteria, column_of, whole_number
from dibs.dialects import Backend, backend_for
from dibs.dialects.base import inline
from dibs.lease.table import LeasedTable
from dibs.lease.transaction import transaction


class Recovering(LeasedTable):
    """Leases.recover; see :class:`~dibs.Leases`."""

    def recover(
        self,
        bind: Engine | Connection,
        *,
        where: Criteria = None,
        status: str | None = None,
        set: Mapping[Any, Any] | None = None,
        batch: int | None = None,
    ) -> list[tuple[Any, ...]]:
        """Put running rows whose lease expired back to ``status``.

        A later write by the lost holder finds the row no longer running and changes nothing.

        Args:
            bind: An Engine or Connection; in a Connection's open transaction the writes join it.
            where: More criteria the rows must meet.
            status: The status to set; ready unless given.
            set: More columns to set (not the status or the lease's expiry, which recover sets itself).
            batch: Recover in statements of at most that many rows, longest expired first, until one
                finds fewer. Given an index on the lease's expiry, each reads it in order, even where the
                database's statistics would plan the unordered read as a scan of the whole table.
                Outside a transaction of the caller's each statement commits on its own.

        Returns:
            The keys of the recovered rows.

        Raises:
            InvalidArgument: A batch that is not a positive whole number, or ``set`` naming the status or
                the expiry.
        """
        size = None if batch is None else whole_number(batch, "batch")
        if size is not None and size <= 0:
            raise InvalidArgument(f"batch must be a positive whole number of rows, got {batch!r}")
        backend = backend_for(bind.dialect)
        criteria: list[Any] = [self.status == inline(self.running), self.expires_at < backend.now()]
        if where is not None:
            criteria.extend([where] if isinstance(where, sa.ClauseElement) else list(where))
        changes = self._recovered_values(backend, status, set)
        found = sa.select(*self.key_columns).where(*criteria).with_for_update(skip_locked=True)
        if size is not None:
            found = found.order_by(self.expires_at).limit(size)
        recovered: list[tuple[Any, ...]] = []
        while True:
            with transaction(bind, backend) as conn:
                keys = list(map(tuple, conn.execute(found)))
                if keys:
                    expired = (
                        sa.tuple_(*self.key_columns).in_(keys)
                        if len(self.key_columns) > 1
                        else self.key_columns[0].in_([key[0] for key in keys])
                    )
                    # The criteria again: a row renewed between the read and the write is left alone.
                    conn.execute(sa.update(self.table).where(expired, *criteria).values(changes))
            recovered.extend(keys)
            if size is None or len(keys) < size:
                return recovered

    def _recovered_values(
        self, backend: Backend, status: str | None, values: Mapping[Any, Any] | None
    ) -> dict[Any, Any]:
        """What recover() sets: the status, no lease, the finishing time if the row finishes, the caller's."""
        changes: dict[Any, Any] = {self.status: status or self.ready, self.expires_at: None, self.owner: None}
        if self.finished_at is not None and (status or self.ready) != self.ready:
            changes[self.finished_at] = backend.now()
        by_column = {column_of(self.table, key, "set"): value for key, value in (values or {}).items()}
        for column in by_column:
            if column is self.status or column is self.expires_at:
                raise InvalidArgument(
                    f"set must not name {column.name}: recover sets the status (pass status=) and clears the "
                    "lease's expiry itself"
                )
        changes.update(by_column)
        return changes
