"""The value a claim hands out, a :class:`Lease`, and the columns a leased table needs."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Row

from dibs._checks import OWNER_LIMIT, checked_seconds
from dibs.schema import Timestamp

#: A lease's length: a timedelta or a number of seconds.
Duration = timedelta | float | int
#: Bind parameter names the claim statements share with the values given per call.
OWNER_PARAMETER = "dibs_lease_owner"
SECONDS_PARAMETER = "dibs_lease_seconds"


def lease_columns(
    *,
    status: str = "status",
    owner: str = "lease_owner",
    expires_at: str = "lease_expires_at",
    token: str = "lease_token",
    attempts: str = "attempts",
    ready: str = "ready",
) -> list[sa.Column[Any]]:
    """Fresh columns that give a table what :class:`~dibs.Leases` needs; add them to your Table definition.

    Args:
        status: Name of the status column (a string of up to 32 characters).
        owner: Name of the column holding the owner of the current lease.
        expires_at: Name of the column holding the lease's expiry, on the database clock.
        token: Name of the fencing token column, raised by one at every claim.
        attempts: Name of the column counting claims.
        ready: The status a new row starts in (the column's server default).

    Returns:
        Five new columns, to be added to one Table (a Column belongs to one table only).

    Example:
        >>> import sqlalchemy as sa, dibs
        >>> tasks = sa.Table("tasks", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True),
        ...                  *dibs.lease_columns())
    """
    return [
        sa.Column(status, sa.String(32), nullable=False, server_default=ready),
        sa.Column(owner, sa.String(OWNER_LIMIT), nullable=True),
        sa.Column(expires_at, Timestamp, nullable=True),
        sa.Column(token, sa.BigInteger, nullable=False, server_default="0"),
        sa.Column(attempts, sa.Integer, nullable=False, server_default="0"),
    ]


class Lease(NamedTuple):
    """One claimed row and the proof of holding it: its key and the token the claim gave it.

    Immutable. A named tuple because a claim makes one per row, and no immutable value is cheaper to make.

    Attributes:
        key: The row's primary key values, in the key's column order.
        token: The fencing token the claim gave the row; every later write presents it.
        owner: The owner the row is leased to.
        expires_at: When the lease expires, on the database clock, timezone-aware.
        row: The claimed row as stored after the claim.
    """

    key: tuple[Any, ...]
    token: int
    owner: str
    expires_at: datetime
    row: Row[Any]


#: ``Lease(key, token, owner, expires_at, row)`` from one tuple of the five, without the keyword handling.
made_lease: Callable[[Any, tuple[Any, ...]], Lease] = tuple.__new__


def _seconds(duration: Duration, name: str = "duration") -> float:
    return checked_seconds(duration, name)
