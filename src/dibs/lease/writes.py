"""The guarded writes a lease holder makes (renew, complete, fail, release), each fenced by the lease's
token, one statement per chunk of leases, in the way the backend offers (see Backend.guarded_write)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dibs._errors import InvalidArgument, LeaseLost
from dibs.claim import column_of
from dibs.dialects import Backend, backend_for, driver
from dibs.dialects.base import inline, resolve_times
from dibs.lease.table import LeasedTable, WriteStatements
from dibs.lease.transaction import transaction
from dibs.lease.value import SECONDS_PARAMETER, Duration, Lease, _seconds

#: Lease writes go in chunks of at most this many leases, which bounds both the statement's parameters
#: and PostgreSQL's per-row scan of the token array.
WRITE_CHUNK = 1000


class _SomeLost(Exception):
    """A lease write without RETURNING changed fewer rows than it had leases: some were lost."""


class Writes(LeasedTable):
    """The guarded writes of :class:`~dibs.Leases`."""

    def renew(self, bind: Engine | Connection, lease: Lease, duration: Duration) -> None:
        """Extend a held lease to ``duration`` from now on the database clock.

        Args:
            bind: An Engine or Connection; in a Connection's open transaction the write joins it.
            lease: The lease to extend.
            duration: The new length from now (a timedelta or seconds).

        Raises:
            LeaseLost: The lease is no longer held; nothing was changed.
        """
        self._raise_lost(self.renew_many(bind, [lease], duration), "renew")

    def renew_many(self, bind: Engine | Connection, leases: Sequence[Lease], duration: Duration) -> list[Lease]:
        """Extend many leases in one statement.

        Args:
            bind: An Engine or Connection; in a Connection's open transaction the write joins it.
            leases: The leases to extend (a list, not one Lease).
            duration: The new length from now (a timedelta or seconds).

        Returns:
            The leases that were lost, and not renewed.
        """
        backend = backend_for(bind.dialect)
        return self._write(
            bind, leases, "renew", self.running, {SECONDS_PARAMETER: backend.after_value(_seconds(duration))}
        )

    def complete(
        self,
        bind: Engine | Connection,
        lease: Lease,
        *,
        status: str | None = None,
        set: Mapping[Any, Any] | None = None,
    ) -> None:
        """Finish a held lease.

        Args:
            bind: An Engine or Connection; in a Connection's open transaction the write joins it.
            lease: The lease to finish.
            status: The status to set; ``done`` (the Leases' ``done=``) unless given.
            set: More columns to set in the same statement: values or SQL expressions.

        Raises:
            LeaseLost: The lease is no longer held; nothing was changed.
        """
        self._raise_lost(self.complete_many(bind, [lease], status=status, set=set), "complete")

    def complete_many(
        self,
        bind: Engine | Connection,
        leases: Sequence[Lease],
        *,
        status: str | None = None,
        set: Mapping[Any, Any] | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> list[Lease]:
        r"""Finish many leases in one statement.

        Args:
            bind: An Engine or Connection; in a Connection's open transaction the write joins it.
            leases: The leases to finish (a list, not one Lease).
            status: The status to set; ``done`` unless given.
            set: More columns to set: values or SQL expressions.
            parameters: Values of named ``sa.bindparam``\ s inside SQL expressions in ``set``.

        Returns:
            The leases that were lost, and left unchanged.
        """
        return self._write(bind, leases, "finish", status or self.done, dict(parameters or {}), set)

    def fail(
        self,
        bind: Engine | Connection,
        lease: Lease,
        *,
        status: str | None = None,
        set: Mapping[Any, Any] | None = None,
    ) -> None:
        """Mark a held lease failed.

        Args:
            bind: An Engine or Connection; in a Connection's open transaction the write joins it.
            lease: The lease to fail.
            status: The status to set; ``failed`` (the Leases' ``failed=``) unless given.
            set: More columns to set in the same statement.

        Raises:
            LeaseLost: The lease is no longer held; nothing was changed.
        """
        self._raise_lost(self.fail_many(bind, [lease], status=status, set=set), "fail")

    def fail_many(
        self,
        bind: Engine | Connection,
        leases: Sequence[Lease],
        *,
        status: str | None = None,
        set: Mapping[Any, Any] | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> list[Lease]:
        r"""Mark many leases failed in one statement.

        Args:
            bind: An Engine or Connection; in a Connection's open transaction the write joins it.
            leases: The leases to fail (a list, not one Lease).
            status: The status to set; ``failed`` unless given.
            set: More columns to set.
            parameters: Values of named ``sa.bindparam``\ s inside SQL expressions in ``set``.

        Returns:
            The leases that were lost, and left unchanged.
        """
        return self._write(bind, leases, "finish", status or self.failed, dict(parameters or {}), set)

    def release(self, bind: Engine | Connection, lease: Lease) -> None:
        """Give back a lease whose work never started: ready again at once, and the attempt not counted.

        Args:
            bind: An Engine or Connection; in a Connection's open transaction the write joins it.
            lease: The lease to give back.

        Raises:
            LeaseLost: The lease is no longer held; nothing was changed.
        """
        self._raise_lost(self.release_many(bind, [lease]), "release")

    def release_many(self, bind: Engine | Connection, leases: Sequence[Lease]) -> list[Lease]:
        """Give back many unstarted leases in one statement.

        Args:
            bind: An Engine or Connection; in a Connection's open transaction the write joins it.
            leases: The leases to give back (a list, not one Lease).

        Returns:
            The leases that were lost, and left unchanged.
        """
        return self._write(bind, leases, "release", self.ready, {})

    def _write(
        self,
        bind: Engine | Connection,
        leases: Sequence[Lease],
        action: str,
        status: str,
        parameters: dict[str, Any],
        values: Mapping[Any, Any] | None = None,
    ) -> list[Lease]:
        if isinstance(leases, Lease):  # a lease is a tuple: iterating it would give its fields
            raise InvalidArgument(
                "the *_many() lease methods take a list of leases, got one Lease; pass [lease], or call the "
                "method for one lease (complete, fail, release, renew)"
            )
        if not leases:
            return []
        backend = backend_for(bind.dialect)
        by_column = {column_of(self.table, key, "set"): value for key, value in (values or {}).items()}
        statements = self._write_statements(backend, action, status, by_column)
        parameters = {
            **parameters,
            **{
                f"dibs_set_{column.name}": value
                for column, value in by_column.items()
                if not isinstance(value, sa.ClauseElement)
            },
        }
        resolve_times(parameters)
        way = backend.guarded_write(bind.dialect)
        if way == "returning":
            return self._write_returning(bind, backend, statements.returning, leases, parameters)
        # Counting needs a transaction of its own, which it rolls back when a lease was lost.
        if way == "counting" and (isinstance(bind, Engine) or not bind.in_transaction()):
            try:
                return self._write_counting(bind, backend, statements.write, leases, parameters)
            except _SomeLost:
                pass  # rolled back: the locking read below finds out which
        return self._write_locking(bind, backend, statements, leases, parameters)

    def _chunks(
        self, backend: Backend, leases: Sequence[Lease], parameters: dict[str, Any]
    ) -> Iterator[tuple[Sequence[Lease], dict[str, Any]]]:
        """The leases in chunks of at most WRITE_CHUNK, each with its statement's parameters."""
        for start in range(0, len(leases), WRITE_CHUNK):
            chunk = leases[start : start + WRITE_CHUNK]
            pairs = [(*lease.key, lease.token) for lease in chunk]
            yield chunk, {**parameters, **backend.fenced_values(self.key_columns, pairs)}

    def _write_returning(
        self,
        bind: Engine | Connection,
        backend: Backend,
        statement: sa.Update,
        leases: Sequence[Lease],
        parameters: dict[str, Any],
    ) -> list[Lease]:
        """One statement per chunk, returning the (key..., token) of the rows it changed."""
        fenced_columns = (*self.key_columns, self.token)
        lost: list[Lease] = []
        # One statement is atomic on its own, so it may run in autocommit where the backend allows; more (a
        # write of more leases than one statement takes) run in the backend's transaction, all or none.
        with transaction(bind, backend, one_statement=len(leases) <= WRITE_CHUNK) as conn:
            for chunk, chunk_parameters in self._chunks(backend, leases, parameters):
                changed = driver.fetch_values(conn, statement, chunk_parameters, fenced_columns)
                # A row changes once however often its lease is listed: as many rows as leases means every
                # lease was held (the common case, told without matching them up).
                if len(changed) != len(chunk):
                    done = set(map(tuple, changed))
                    lost.extend(lease for lease in chunk if (*lease.key, lease.token) not in done)
        return lost

    def _write_counting(
        self,
        bind: Engine | Connection,
        backend: Backend,
        statement: sa.Update,
        leases: Sequence[Lease],
        parameters: dict[str, Any],
    ) -> list[Lease]:
        """Where there is no RETURNING and the write is a transaction of its own: the UPDATE alone, which
        changed as many rows as there are distinct leases exactly when every lease was held (the common
        case, in one round trip instead of a locking read and the write). Otherwise it is rolled back and
        _SomeLost raised."""
        with transaction(bind, backend) as conn:
            for chunk, chunk_parameters in self._chunks(backend, leases, parameters):
                distinct = len({(*lease.key, lease.token) for lease in chunk})
                if conn.execute(statement, chunk_parameters).rowcount != distinct:
                    raise _SomeLost
        return []

    def _write_locking(
        self,
        bind: Engine | Connection,
        backend: Backend,
        statements: WriteStatements,
        leases: Sequence[Lease],
        parameters: dict[str, Any],
    ) -> list[Lease]:
        """Where there is no RETURNING: lock and read the (key..., token) of the rows still held, then write
        exactly those. A locking read sees the latest committed rows whatever the caller's snapshot, and the
        backend's own transaction, real even in autocommit mode, keeps its locks until the write."""
        written: set[tuple[Any, ...]] = set()
        with transaction(bind, backend) as conn:
            for _, chunk_parameters in self._chunks(backend, leases, parameters):
                held = set(map(tuple, conn.execute(statements.held, chunk_parameters)))
                if held:
                    conn.execute(statements.write, chunk_parameters)
                written |= held
        return [lease for lease in leases if (*lease.key, lease.token) not in written]

    def _write_statements(
        self, backend: Backend, action: str, status: str, values: Mapping[sa.Column[Any], Any]
    ) -> WriteStatements:
        """The guarded UPDATE for one kind of write, built once. The caller's plain values are bound; its SQL
        expressions are part of the statement, which is kept for as long as the caller keeps passing the
        same expression object (the stores build theirs once)."""
        shape = tuple(
            sorted(
                (column.name, id(value) if isinstance(value, sa.ClauseElement) else None)
                for column, value in values.items()
            )
        )
        key = (backend.name, action, status, shape)
        found = self._write_templates.get(key)
        if found is not None:
            self._write_templates.move_to_end(key)
            return found
        changes: dict[Any, Any] = {self.status: inline(status)}
        if action == "renew":
            changes = {self.expires_at: backend.after(SECONDS_PARAMETER)}
        elif action == "release":
            # Ready again and nobody's, as recover() leaves an expired row.
            changes.update({self.expires_at: None, self.owner: None, self.attempts: self.attempts - inline(1)})
        else:
            changes[self.expires_at] = None
            if self.finished_at is not None:
                changes[self.finished_at] = backend.now()
        for column, value in values.items():
            bound = not isinstance(value, sa.ClauseElement)
            changes[column] = sa.bindparam(f"dibs_set_{column.name}", type_=column.type) if bound else value
        still_held = sa.and_(backend.fenced(self.key_columns, self.token), self.status == inline(self.running))
        change = sa.update(self.table).where(still_held).values(changes)
        statements = WriteStatements(
            write=change,
            returning=change.returning(*self.key_columns, self.token),
            held=sa.select(*self.key_columns, self.token).where(still_held).with_for_update(),
        )
        self._write_templates[key] = statements
        if len(self._write_templates) > 256:  # expressions made anew for every call: keep the recent ones
            self._write_templates.popitem(last=False)
        return statements

    @staticmethod
    def _raise_lost(lost: list[Lease], action: str) -> None:
        if lost:
            lease = lost[0]
            raise LeaseLost(
                f"cannot {action}: the lease on row {lease.key!r} with token {lease.token} is no longer held "
                "(it expired and was claimed again, or was already finished or released); nothing was "
                "changed. Stop working on this row.",
                leases=tuple(lost),
            )
