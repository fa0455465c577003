"""Upkeep: periodic maintenance chores of a service, each with its own interval, one at a time.

Chores run apart from the service's main work (never inside a claim), one after another on one task, so
that maintenance holds at most one database thread at a time. A chore that fails is logged and tried again
at its next turn; the others go on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field


@dataclass(eq=False)
class Chore:
    """One maintenance chore: ``work`` is awaited every ``every`` seconds (counted from the end of its last run).

    Example:
        >>> async def sweep() -> None: ...
        >>> Chore("sweep", 60.0, sweep).is_due(now=0.0)
        True
    """

    #: Its name, for the logs.
    name: str
    #: Seconds from the end of one run to the start of the next.
    every: float
    #: The chore itself.
    work: Callable[[], Awaitable[object]]
    #: When its last run ended (``time.monotonic()``); None: it has not run, so it is due at once.
    last: float | None = field(default=None)

    def is_due(self, now: float) -> bool:
        """Whether it is to run at ``now``."""
        return self.last is None or now - self.last >= self.every

    def due_in(self, now: float) -> float:
        """Seconds from ``now`` until it is due (0 if it is)."""
        return 0.0 if self.last is None else max(0.0, self.last + self.every - now)


def until_done(name: str, every: float, step: Callable[[], Awaitable[bool]]) -> Chore:
    """A chore that awaits ``step`` at its turns until it returns True (nothing is left to do), then no more.

    Example:
        >>> async def look() -> bool: return True
        >>> until_done("look", 1.0, look).name
        'look'
    """
    done = False

    async def work() -> None:
        nonlocal done
        if not done:
            done = await step()

    return Chore(name, every, work)


class Upkeep:
    """Runs chores, each when it is due, until cancelled.

    Args:
        chores: The chores.
        failed: Called with the chore and its error when a run fails.

    Example:
        >>> async def sweep() -> None: ...
        >>> upkeep = Upkeep([Chore("sweep", 60.0, sweep)])
        >>> [chore.name for chore in upkeep.due(now=0.0)]
        ['sweep']
    """

    def __init__(self, chores: Sequence[Chore], *, failed: Callable[[Chore, Exception], None] | None = None) -> None:
        self.chores = list(chores)
        self._failed = failed

    def due(self, now: float) -> list[Chore]:
        """The chores to run at ``now``, in the order given."""
        return [chore for chore in self.chores if chore.is_due(now)]

    def wait(self, now: float) -> float:
        """Seconds from ``now`` until the next chore is due."""
        return min((chore.due_in(now) for chore in self.chores), default=60.0)

    async def run_due(self, stopping: Callable[[], bool] = lambda: False) -> None:
        """Run every chore due now, once each, unless ``stopping`` says to stop before the next one."""
        for chore in self.due(time.monotonic()):
            if stopping():
                return
            try:
                await chore.work()
            except Exception as error:
                if self._failed is not None:
                    self._failed(chore, error)
            chore.last = time.monotonic()

    async def run(self) -> None:
        """Run the chores as they come due, until cancelled."""
        while True:
            await self.run_due()
            await asyncio.sleep(self.wait(time.monotonic()))
