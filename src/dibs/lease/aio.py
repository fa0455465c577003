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
        """:meth:`renew` for asyncio, on an AsyncEngine or AsyncConnection.

        Args:
            bind: An AsyncEngine or AsyncConnection; in an open transaction the write joins it.
            lease: As for :meth:`renew`.
            duration: As for :meth:`renew`.

        Raises:
            LeaseLost: The lease is no longer held; nothing was changed.
        """
        self._raise_lost(await self.arenew_many(bind, [lease], duration), "renew")

    async def arenew_many(
        self, bind: AsyncEngine | AsyncConnection, leases: Sequence[Lease], duration: Duration
    ) -> list[Lease]:
        """:meth:`renew_many` for asyncio, on an AsyncEngine or AsyncConnection.

        Args:
            bind: An AsyncEngine or AsyncConnection; in an open transaction the write joins it.
            leases: As for :meth:`renew_many`.
            duration: As for :meth:`renew_many`.

        Returns:
            The leases that were lost.
        """
        return await run_async(bind, self.renew_many, leases, duration)

    async def acomplete(
        self,
        bind: AsyncEngine | AsyncConnection,
        lease: Lease,
        *,
        status: str | None = None,
        set: Mapping[Any, Any] | None = None,
    ) -> None:
        """:meth:`complete` for asyncio, on an AsyncEngine or AsyncConnection.

        Args:
            bind: An AsyncEngine or AsyncConnection; in an open transaction the write joins it.
            lease: As for :meth:`complete`.
            status: As for :meth:`complete`.
            set: As for :meth:`complete`.

        Raises:
            LeaseLost: The lease is no longer held; nothing was changed.
        """
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
        """:meth:`complete_many` for asyncio, on an AsyncEngine or AsyncConnection.

        Args:
            bind: An AsyncEngine or AsyncConnection; in an open transaction the write joins it.
            leases: As for :meth:`complete_many`.
            status: As for :meth:`complete_many`.
            set: As for :meth:`complete_many`.
            parameters: As for :meth:`complete_many`.

        Returns:
            The leases that were lost.
        """
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
        """:meth:`fail` for asyncio, on an AsyncEngine or AsyncConnection.

        Args:
            bind: An AsyncEngine or AsyncConnection; in an open transaction the write joins it.
            lease: As for :meth:`fail`.
            status: As for :meth:`fail`.
            set: As for :meth:`fail`.

        Raises:
            LeaseLost: The lease is no longer held; nothing was changed.
        """
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
        """:meth:`fail_many` for asyncio, on an AsyncEngine or AsyncConnection.

        Args:
            bind: An AsyncEngine or AsyncConnection; in an open transaction the write joins it.
            leases: As for :meth:`fail_many`.
            status: As for :meth:`fail_many`.
            set: As for :meth:`fail_many`.
            parameters: As for :meth:`fail_many`.

        Returns:
            The leases that were lost.
        """
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
        """:meth:`recover` for asyncio, on an AsyncEngine or AsyncConnection.

        Args:
            bind: An AsyncEngine or AsyncConnection; in an open transaction the write joins it.
            where: As for :meth:`recover`.
            status: As for :meth:`recover`.
            set: As for :meth:`recover`.
            batch: As for :meth:`recover`.

        Returns:
            The keys of the recovered rows.
        """
        return await run_async(bind, lambda conn: self.recover(conn, where=where, status=status, set=set, batch=batch))

    async def arelease(self, bind: AsyncEngine | AsyncConnection, lease: Lease) -> None:
        """:meth:`release` for asyncio, on an AsyncEngine or AsyncConnection.

        Args:
            bind: An AsyncEngine or AsyncConnection; in an open transaction the write joins it.
            lease: As for :meth:`release`.

        Raises:
            LeaseLost: The lease is no longer held; nothing was changed.
        """
        self._raise_lost(await self.arelease_many(bind, [lease]), "release")

    async def arelease_many(self, bind: AsyncEngine | AsyncConnection, leases: Sequence[Lease]) -> list[Lease]:
        """:meth:`release_many` for asyncio, on an AsyncEngine or AsyncConnection.

        Args:
            bind: An AsyncEngine or AsyncConnection; in an open transaction the write joins it.
            leases: As for :meth:`release_many`.

        Returns:
            The leases that were lost.
        """
        return await run_async(bind, self.release_many, leases)
