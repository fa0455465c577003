"""The :class:`Leases` API, assembled from taking, recovering and writing leases."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dibs.claim import Criteria, Ordering
from dibs.lease.aio import AsyncWrites
from dibs.lease.claimer import Claimer
from dibs.lease.claiming import Claiming


class Leases(Claiming, AsyncWrites):
    """Fenced leases over a table that has the columns :func:`~dibs.lease_columns` makes (names configurable).

    A claim leases rows to an owner for a duration and gives each a new token; every later write (renew,
    complete, fail, release) presents the token and changes nothing once the lease was lost.

    Args:
        table: A SQLAlchemy Table (or ORM mapped class) with a primary key and the lease columns.
        status: Name of the status column.
        owner: Name of the lease owner column.
        expires_at: Name of the lease expiry column.
        token: Name of the fencing token column.
        attempts: Name of the column counting claims.
        ready: Status of a row that may be claimed.
        running: Status of a leased row.
        done: Status complete() sets unless told otherwise.
        failed: Status fail() sets unless told otherwise.
        strategy: The claim strategy by name, as :func:`dibs.claim` takes it; None for the native one.
        reclaim_expired: Whether a claim also takes running rows whose lease expired. Without it a claim
            reads only ready rows (an index on them stays small) and :meth:`recover` puts expired rows back.
        finished_at: Name of a column every finishing write (complete, fail) sets to the database clock.

    Raises:
        InvalidArgument: A column named is not in the table.

    Example:
        >>> leases = dibs.Leases(tasks)
        >>> for lease in leases.claim(engine, owner="worker-1", duration=30, limit=10):
        ...     handle(lease.row)
        ...     leases.complete(engine, lease)
    """

    def claimer(
        self,
        *,
        where: Criteria = None,
        order_by: Ordering = (),
        set: Mapping[Any, Any] | None = None,
        columns: Sequence[Any] | None = None,
    ) -> Claimer:
        r"""A claim whose criteria, order and values are fixed, built once per database and reused.

        Args:
            where: Criteria the rows must meet; values that change from call to call go in as named
                ``sa.bindparam``\ s, given to :meth:`Claimer.claim` as ``parameters``.
            order_by: Which rows to lease first.
            set: More columns the claim sets (named ``sa.bindparam``\ s allowed, as in ``where``).
            columns: What each lease's row holds (the key, token and expiry are always among them):
                fewer columns, less to decode.

        Returns:
            The :class:`~dibs.Claimer`.

        Example:
            >>> claimer = leases.claimer(where=tasks.c.queue == sa.bindparam("queue"), order_by="id")
            >>> claimer.claim(engine, owner="w1", duration=30, limit=10, parameters={"queue": "emails"})
        """
        return Claimer(self, where, order_by, set, columns)
