"""One write for many items: collected as they come, flushed after ``size`` items or ``age`` seconds.

With no ``age`` a flush begins as soon as there is something to write and the previous flush is done, so
that items that come while one write runs go together in the next: batches grow with the load, and an item
never waits for a timer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


def is_due(count: int, oldest_age: float, *, size: int | None, age: float) -> bool:
    """Whether ``count`` items, the oldest ``oldest_age`` seconds old, are to be written now.

    Args:
        count: Items collected.
        oldest_age: Seconds since the first of them came.
        size: Items that make a batch full (None: no limit).
        age: Seconds an item may wait for others (0: none).

    Returns:
        True when there is something to write and the batch is full, old enough, or no wait is wanted.
    """
    if count == 0:
        return False
    return age <= 0 or (size is not None and count >= size) or oldest_age >= age


class BatchWriter(Generic[T]):
    """Collects items and writes them in batches, one write at a time, from one task on the service's loop.

    Args:
        write: Writes a batch; raising keeps the batch for the next flush.
        size: Items that make a batch full: flushed then, even if ``age`` has not passed.
        age: Seconds the first item of a batch waits for more (0, the default: none).
        failed: Called with the error and the batch when a write failed; the batch is written again
            ``retry_after`` seconds later, with whatever came meanwhile.
        retry_after: Seconds between a failed write and the next try.

    Example:
        >>> async def demo() -> list[list[int]]:
        ...     written: list[list[int]] = []
        ...     async def write(batch: list[int]) -> None:
        ...         written.append(batch)
        ...     writer = BatchWriter(write)
        ...     writer.start()
        ...     writer.add(1)
        ...     writer.add(2)
        ...     await writer.stop()
        ...     return written
        >>> asyncio.run(demo())
        [[1, 2]]
    """

    def __init__(
        self,
        write: Callable[[list[T]], Awaitable[None]],
        *,
        size: int | None = None,
        age: float = 0.0,
        failed: Callable[[Exception, list[T]], None] | None = None,
        retry_after: float = 0.5,
    ) -> None:
        self.size = size
        self.age = age
        #: Writes under way: items taken from the buffer and not yet written.
        self.writing = 0
        self._write = write
        self._failed = failed
        self._retry_after = retry_after
        self._items: list[T] = []
        self._ready: asyncio.Event | None = None
        self._open = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Begin flushing, on the running loop."""
        self._ready = asyncio.Event()
        self._open = True
        self._task = asyncio.create_task(self._run(), name="dibs-batch-writer")

    def add(self, item: T) -> None:
        """Collect an item for the next flush (on the loop's thread; cheap: an append and a flag)."""
        self._items.append(item)
        assert self._ready is not None
        self._ready.set()

    @property
    def pending(self) -> int:
        """Items collected and not yet taken by a write."""
        return len(self._items)

    async def flush(self) -> None:
        """Write what has been collected now, as one batch; a failure is reported and the batch kept."""
        if not self._items:
            return
        batch, self._items = self._items, []
        self.writing += 1
        try:
            await self._write(batch)
        except Exception as error:
            self._items[:0] = batch
            if self._failed is not None:
                self._failed(error, batch)
            # Try again even if no other item comes to wake the writer (these may have been the last).
            await asyncio.sleep(self._retry_after)
            if self._ready is not None:
                self._ready.set()
        finally:
            self.writing -= 1

    async def stop(self) -> None:
        """Finish the write under way (never cancelled: it is counted once done), then write what is left."""
        self._open = False
        if self._ready is not None:
            self._ready.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.flush()

    async def _run(self) -> None:
        ready = self._ready
        assert ready is not None
        while self._open:
            await ready.wait()
            ready.clear()
            if self.age > 0:
                await self._gather(ready)
            await self.flush()

    async def _gather(self, ready: asyncio.Event) -> None:
        """Wait until the batch is full or its first item ``age`` seconds old (or the writer stops)."""
        first = time.monotonic()
        while self._open and not is_due(len(self._items), time.monotonic() - first, size=self.size, age=self.age):
            left = self.age - (time.monotonic() - first)
            try:
                await asyncio.wait_for(ready.wait(), left)
            except asyncio.TimeoutError:
                return
            ready.clear()
