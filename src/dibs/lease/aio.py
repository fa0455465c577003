"""The asyncio forms of the lease writes: each runs its sync form on the async connection's thread."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dibs.claim import Criteria
from dibs.lease.recover import Recovering
from dibs.lease.transaction import run_async
from dibs.lease.value import Duration, Lease
from dibs.lease.writes import Writes

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine


class AsyncWrites(Writes, Recovering):
    """The asyncio writes of :class:`~dibs.Leases`."""

    async def arenew(self, bind: AsyncEngine | AsyncConnection, lease: Lease, duration: Duration) -> None:
        """renew() for asyncio."""
        self._raise_lost(await self.arenew_many(bind, [lease], duration), "renew")

    async def arenew_many(
        self, bind: AsyncEngine | AsyncConnection, leases: Sequence[Lease], duration: Duration
    ) -> list[Lease]:
        """renew_many() for asyncio."""
        return await run_async(bind, self.renew_many, leases, duration)

    async def acomplete(
        self,
        bind: AsyncEngine | AsyncConnection,
        lease: Lease,
        *,
        status: str | None = None,
        set: Mapping[Any, Any] | None = None,
    ) -> None:
        """complete() for asyncio."""
        self._raise_lost(await self.acomplete_many(bind, [lease], status=status, set=set), "complete")

    async def acomplete_many(
        self,
        bind: AsyncEngine | AsyncConnection,
        leases: Sequence[Lease],
        *,
        status: str | None = None,
        set: Mapping[Any, Any] | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> list[Lease]:
        """complete_many() for asyncio."""
        return await run_async(
            bind, lambda conn: self.complete_many(conn, leases, status=status, set=set, parameters=parameters)
        )

    async def afail(
        self,
        bind: AsyncEngine | AsyncConnection,
        lease: Lease,
        *,
        status: str | None = None,
        set: Mapping[Any, Any] | None = None,
    ) -> None:
        """fail() for asyncio."""
        self._raise_lost(await self.afail_many(bind, [lease], status=status, set=set), "fail")

    async def afail_many(
        self,
        bind: AsyncEngine | AsyncConnection,
        leases: Sequence[Lease],
        *,
        status: str | None = None,
        set: Mapping[Any, Any] | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> list[Lease]:
        """fail_many() for asyncio."""
        return await run_async(
            bind, lambda conn: self.fail_many(conn, leases, status=status, set=set, parameters=parameters)
        )

    async def arecover(
        self,
        bind: AsyncEngine | AsyncConnection,
        *,
        where: Criteria = None,
        status: str | None = None,
        set: Mapping[Any, Any] | None = None,
        batch: int | None = None,
    ) -> list[tuple[Any, ...]]:
        """recover() for asyncio."""
        return await run_async(bind, lambda conn: self.recover(conn, where=where, status=status, set=set, batch=batch))

    async def arelease(self, bind: AsyncEngine | AsyncConnection, lease: Lease) -> None:
        """release() for asyncio."""
        self._raise_lost(await self.arelease_many(bind, [lease]), "release")

    async def arelease_many(self, bind: AsyncEngine | AsyncConnection, leases: Sequence[Lease]) -> list[Lease]:
        """release_many() for asyncio."""
        return await run_async(bind, self.release_many, leases)
