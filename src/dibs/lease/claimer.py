"""A lease claim built once and called many times (:meth:`dibs.Leases.claimer`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dibs._checks import checked_owner
from dibs.claim import Criteria, Ordering, arun_claim, column_of, ordering, run_claim, whole_number
from dibs.dialects import ClaimRequest, backend_for
from dibs.lease.claiming import Claiming
from dibs.lease.table import LeaseFields
from dibs.lease.value import OWNER_PARAMETER, SECONDS_PARAMETER, Duration, Lease, _seconds

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine


class Claimer:
    """A lease claim with fixed criteria, order and values (see :meth:`dibs.Leases.claimer`)."""

    def __init__(
        self,
        leases: Claiming,
        where: Criteria,
        order_by: Ordering,
        values: Mapping[Any, Any] | None,
        columns: Sequence[Any] | None,
    ) -> None:
        self.leases = leases
        self._where = where
        self._order = ordering(leases.table, order_by)
        self._values = dict(values or {})
        self._templates: dict[str, ClaimRequest] = {}
        self._columns: tuple[sa.Column[Any], ...] = ()
        if columns is not None:
            # The key, token and expiry come back whatever else is asked for: a lease needs them.
            needed = [*leases.key_columns, leases.token, leases.expires_at]
            asked = [column_of(leases.table, column, "Leases.claimer(columns=)") for column in columns]
            self._columns = tuple(dict.fromkeys([*needed, *asked]))
        self._fields = LeaseFields.of(self._columns or tuple(leases.table.columns), leases)

    def claim(
        self,
        bind: Engine | Connection,
        *,
        owner: str,
        duration: Duration,
        limit: int,
        parameters: Mapping[str, Any] | None = None,
    ) -> list[Lease]:
        """Lease up to ``limit`` rows to ``owner`` for ``duration``.

        Args:
            bind: An Engine, or a Connection with no transaction open.
            owner: Who holds the leases.
            duration: How long the leases last (a timedelta or seconds).
            limit: The most rows to lease.
            parameters: Values of the named ``sa.bindparam`` s in the claimer's ``where`` and ``set``.

        Returns:
            One :class:`~dibs.Lease` per claimed row.
        """
        request = self._request(bind, owner, duration, limit, parameters)
        return self.leases._leases(run_claim(bind, request, self.leases.strategy), owner, self._fields)

    async def aclaim(
        self,
        bind: AsyncEngine | AsyncConnection,
        *,
        owner: str,
        duration: Duration,
        limit: int,
        parameters: Mapping[str, Any] | None = None,
    ) -> list[Lease]:
        """:meth:`claim` for asyncio.

        Args:
            bind: An AsyncEngine, or an AsyncConnection with no transaction open.
            owner: Who holds the leases.
            duration: How long the leases last (a timedelta or seconds).
            limit: The most rows to lease.
            parameters: Values of the named ``sa.bindparam`` s in the claimer's ``where`` and ``set``.

        Returns:
            One :class:`~dibs.Lease` per claimed row.
        """
        request = self._request(bind, owner, duration, limit, parameters)
        return self.leases._leases(await arun_claim(bind, request, self.leases.strategy), owner, self._fields)

    def _request(
        self, bind: Any, owner: str, duration: Duration, limit: int, parameters: Mapping[str, Any] | None
    ) -> ClaimRequest:
        checked_owner(owner)
        backend = backend_for(bind.dialect)
        template = self._templates.get(backend.name)
        if template is None:
            template = self._templates[backend.name] = dataclasses.replace(
                self.leases._build_claim(backend, self._order, self._where, self._values, shape=object()),
                columns=self._columns,
            )
        values = {
            OWNER_PARAMETER: owner,
            SECONDS_PARAMETER: backend.after_value(_seconds(duration)),
            **(parameters or {}),
        }
        return template.for_call(whole_number(limit), values)
