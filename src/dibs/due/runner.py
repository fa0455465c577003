"""The due runner: takes due rows in rounds and runs the user's handler on each, one source at a time each.

Each round claims at most as many rows as run at once, runs their handlers with no transaction open (the
leases renewed meanwhile by a :class:`~dibs.runtime.LeaseKeeper`), and writes each row's outcome in a short
transaction of its own: a handler that raises fails its row only. A run ends when ``max_sources`` rows were
processed or none is due.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy.engine import Engine, Row

from dibs._checks import default_owner
from dibs._errors import InvalidArgument
from dibs.claim import whole_number
from dibs.lease import Lease, Leases
from dibs.runtime import LeaseKeeper

#: How many times a round claims again while rows read as due but the claim found none.
EMPTY_CLAIM_TRIES = 50

Handler = Callable[[Row[Any]], Any]
AsyncHandler = Callable[[Row[Any]], Awaitable[Any]]


@dataclass
class DueStats:
    """What one :meth:`DueScheduler.run` did."""

    #: Rows claimed.
    claimed: int = 0
    #: Rows whose handler returned, recorded as run.
    succeeded: int = 0
    #: Rows whose handler raised, recorded with their error.
    failed: int = 0
    #: Sources whose outcome was not recorded because their lease had been taken over (they overran it).
    lost: int = 0
    #: Each failed source's key and error.
    errors: dict[Any, str] = field(default_factory=dict)


class DueRows(Protocol):
    """What the runner uses of a :class:`~dibs.DueScheduler`."""

    @property
    def leases(self) -> Leases: ...
    @property
    def lease_seconds(self) -> float: ...
    def claim(self, bind: Engine, *, owner: str, limit: int = 1) -> list[Lease]: ...
    def due_rows(self, bind: Engine, limit: int = 100) -> list[Row[Any]]: ...
    def complete(self, bind: Engine, held: Sequence[Lease]) -> list[Lease]: ...
    def fail(self, bind: Engine, held: Sequence[Lease], error: str) -> list[Lease]: ...


class DueRunner:
    """One run of a scheduler's due rows on one database: its limits, its owner name and its stats."""

    def __init__(self, rows: DueRows, bind: Engine, *, max_sources: int, concurrency: int, owner: str | None) -> None:
        self.rows = rows
        self.bind = bind
        self.limit = whole_number(max_sources)
        self.width = whole_number(concurrency)
        if self.limit < 1 or self.width < 1:
            raise InvalidArgument(
                f"max_sources and concurrency must be at least 1, got {max_sources!r}, {concurrency!r}"
            )
        self.owner = owner or default_owner()
        self.stats = DueStats()

    def run(self, handler: Handler) -> DueStats:
        """Run sync ``handler`` on due rows, ``concurrency`` at a time in threads, until done."""
        if is_async(handler):
            raise InvalidArgument("the handler is async: run it with await scheduler.arun(...)")
        with self._keeper() as keeper, ThreadPoolExecutor(self.width, "dibs-due") as pool:
            while held := self._next_round():
                keeper.hold(held)
                outcomes = list(pool.map(lambda lease: _outcome(handler, lease), held))
                for lease, error in zip(held, outcomes, strict=True):
                    keeper.drop(lease)
                    self._finish(lease, error)
        return self.stats

    async def arun(self, handler: AsyncHandler | Handler) -> DueStats:
        """Run ``handler`` on due rows, ``concurrency`` at once on the loop (sync ones in threads), until done;
        database calls go to a thread, one short transaction each."""

        async def one(lease: Lease) -> tuple[Lease, BaseException | None]:
            try:
                if is_async(handler):
                    await handler(lease.row)
                else:
                    result = await asyncio.to_thread(handler, lease.row)
                    if inspect.isawaitable(result):  # a sync callable that hands back a coroutine
                        await result
            except Exception as error:
                return lease, error
            return lease, None

        with self._keeper() as keeper:
            while held := await asyncio.to_thread(self._next_round):
                keeper.hold(held)
                for finished in asyncio.as_completed([one(lease) for lease in held]):
                    lease, error = await finished
                    keeper.drop(lease)
                    await asyncio.to_thread(self._finish, lease, error)
        return self.stats

    def _keeper(self) -> AbstractContextManager[LeaseKeeper]:
        """Renews the leases of the rows whose handlers run, every third of the lease, from a thread: a run
        may have no event loop. A lost lease needs no action here: its outcome's write finds it lost."""
        seconds = self.rows.lease_seconds

        def renew(leases: list[Lease]) -> Sequence[Lease]:
            return self.rows.leases.renew_many(self.bind, leases, seconds)

        return LeaseKeeper(renew, every=seconds / 3, lost=lambda lease: None).in_thread("dibs-due-renewer")

    def _next_round(self) -> list[Lease]:
        """The rows of the next round, counted as claimed; none once the run has processed its limit.

        An empty claim is believed only when no row reads as due: on MySQL and MariaDB a claim whose order no
        index gives locks every due row it sorts until it commits, so a second worker's claim meanwhile finds
        them all taken and returns nothing.
        """
        wanted = min(self.width, self.limit - self.stats.claimed)
        if wanted < 1:
            return []
        for _ in range(EMPTY_CLAIM_TRIES):
            held = self.rows.claim(self.bind, owner=self.owner, limit=wanted)
            if held or not self.rows.due_rows(self.bind, limit=1):
                self.stats.claimed += len(held)
                return held
            time.sleep(0.02)
        return []

    def _finish(self, lease: Lease, error: BaseException | None) -> None:
        """Record one row's outcome: run now, or failed with its error and traceback."""
        stats = self.stats
        if error is None:
            lost = self.rows.complete(self.bind, [lease])
            stats.succeeded += not lost
        else:
            text = f"{type(error).__name__}: {error}"
            formatted = "".join(traceback.format_exception(error))
            lost = self.rows.fail(self.bind, [lease], f"{text}\n\n{formatted}")
            stats.failed += not lost
            stats.errors[lease.key[0] if len(lease.key) == 1 else lease.key] = text
        stats.lost += len(lost)


def is_async(handler: object) -> bool:
    """Whether ``handler`` is an async function, or an object whose ``__call__`` is one."""
    method = getattr(type(handler), "__call__", None)  # noqa: B004 - the method itself: is it async?
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(method)


def _outcome(handler: Handler, lease: Lease) -> BaseException | None:
    try:
        result = handler(lease.row)
    except Exception as error:
        return error
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        return InvalidArgument("the handler returned an awaitable, which run() cannot await: use arun()")
    return None
