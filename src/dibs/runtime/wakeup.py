"""Waking a service that waits for work: a notification where the database sends them, a poll everywhere.

A service sleeps between looks for work. :class:`Wakeup` cuts a sleep short when something it waits for
happens in this process (a job finished, a stop was asked for) or, where the backend can listen for
notifications (PostgreSQL's LISTEN/NOTIFY), when another process announces new work; elsewhere the service
polls, backing off while idle (see :class:`~dibs.runtime.backoff.Backoff`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from sqlalchemy.engine import Engine

from dibs.dialects.backend import Backend, Listener


class Wakeup:
    """A sleep that ends early when woken, on one event loop, woken from any thread.

    Example:
        >>> async def nap(wakeup: Wakeup) -> None:
        ...     wakeup.wake()
        ...     await wakeup.sleep(10.0)  # returns at once: it was woken
        >>> asyncio.run(nap(Wakeup()))
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listener: Listener | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serve ``loop`` (the loop a service runs on; each run of a service has a loop of its own)."""
        self._loop = loop
        self._event = asyncio.Event()

    @property
    def listening(self) -> bool:
        """Whether the database's notifications reach this wake-up now (not while its listener reconnects)."""
        listener = self._listener
        return listener is not None and listener.listening

    def clear(self) -> None:
        """Forget earlier wake-ups: the next :meth:`sleep` waits for a new one (call it before looking for work,
        so that one that comes while looking still cuts the following sleep short)."""
        self._event.clear()

    def wake(self) -> None:
        """End the current or next sleep; only from the loop's thread."""
        self._event.set()

    def wake_threadsafe(self) -> None:
        """End the current or next sleep, from any thread; does nothing once the loop has closed."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._event.set)

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``, or until woken (since the last :meth:`clear`)."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._event.wait(), seconds)

    def listen(self, backend: Backend, engine: Engine, channel: str, wanted: Callable[[str], bool]) -> bool:
        """Be woken by the database's notifications on ``channel`` whose payload is ``wanted``.

        Blocking (it connects); call it from a database thread or before the loop is busy.

        Args:
            backend: The database's backend, asked whether it can listen at all.
            engine: The database to listen on.
            channel: The notification channel.
            wanted: Whether a notification's payload names work for this service.

        Returns:
            True if notifications now wake it; False where the backend has none (the service polls).
        """
        wake = self.wake_threadsafe

        def woken(payload: str) -> None:
            if wanted(payload):
                wake()

        self._listener = backend.listen(engine, channel, woken)
        return self._listener is not None

    def close(self) -> None:
        """Stop listening (blocking: it closes a connection); the sleeps go on working."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
