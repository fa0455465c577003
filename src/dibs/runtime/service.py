"""The start/stop base of every long-running service (a worker, a relay, a due runner).

A service runs on one asyncio loop: :meth:`Service.run` makes one, :meth:`Service.arun` uses the caller's.
Its blocking database calls go to :class:`~dibs.runtime.database.DatabaseThreads`; it sleeps on a
:class:`~dibs.runtime.wakeup.Wakeup`. A subclass supplies its stages through three hooks:

* :meth:`Service.start`: checks and connections before it is ready (a failure here is the caller's to see);
* :meth:`Service.serve`: the work, until it is stopped (or, for a burst, done); returns its result;
* :meth:`Service.close`: the stages' shutdown, awaited whether ``serve`` ended or failed.

:meth:`Service.stop` may be called from any thread; SIGTERM or SIGINT, in the main thread, stop it too: the
first signal gracefully, a second in a hurry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from abc import ABC, abstractmethod
from typing import Generic, TypeVar

from dibs._errors import InEventLoop
from dibs.runtime.database import DatabaseThreads
from dibs.runtime.signals import handle_stop_signals
from dibs.runtime.wakeup import Wakeup

R = TypeVar("R")


class Service(ABC, Generic[R]):
    """A long-running service: one lifecycle, its stages supplied by a subclass.

    Args:
        name: Its name, unique to it (its lease owner name).
        threads: The threads its database calls run on; shut down as it stops.
        handle_signals: Stop on SIGTERM and SIGINT, when run in the main thread.
        log: The logger its start, stop and signals are logged to.

    Attributes:
        ready: Set once it has started and is about to work, cleared when it stops: a readiness check.
        wakeup: What its sleeps wait on; :meth:`stop` wakes it.
    """

    def __init__(self, *, name: str, threads: DatabaseThreads, handle_signals: bool, log: logging.Logger) -> None:
        self.name = name
        self.threads = threads
        self.handle_signals = handle_signals
        self.ready = threading.Event()
        self.wakeup = Wakeup()
        self._log = log
        self._stopping = threading.Event()
        self._hurry = False
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- the hooks ---------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Check and connect what the service needs before it is ready; raising ends the run."""

    @abstractmethod
    async def serve(self) -> R:
        """Do the work until :attr:`stopping` (or until a burst is done); return the result of the run."""

    async def close(self) -> None:
        """Shut the stages down (awaited after :meth:`serve`, whether it returned or raised)."""

    def on_stop(self) -> None:
        """Called on the loop when a stop is asked for; wakes the service (extend it to wake stages too)."""
        self.wakeup.wake()

    # -- control -----------------------------------------------------------------------------------------

    def run(self) -> R:
        """Run on an event loop of its own until stopped; blocks.

        Returns:
            What the run did (the service's stats).

        Raises:
            InEventLoop: It was called where an event loop is running: await :meth:`arun` there.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.arun())
        kind = type(self).__name__
        raise InEventLoop(
            f"{kind}.run() was called inside a running event loop, which it would block; "
            f"use `await {kind.lower()}.arun()` there"
        )

    async def arun(self) -> R:
        """Run on the caller's event loop until stopped.

        Returns:
            What the run did (the service's stats).
        """
        loop = asyncio.get_running_loop()
        self._loop = loop
        self.wakeup.bind(loop)
        try:
            await self.start()
        except BaseException:
            self.threads.shutdown(wait=True)  # not started: leave no database thread behind
            raise
        self._signals(install=True)
        self.ready.set()
        try:
            return await self.serve()
        finally:
            try:
                await self.close()
            finally:
                self._signals(install=False)
                self.threads.shutdown(wait=True)
                self.ready.clear()

    def stop(self, *, hurry: bool = False) -> None:
        """Ask the service to stop, gracefully, from any thread.

        Args:
            hurry: Do not wait for work under way to finish (its grace period is cut short).
        """
        self._hurry = self._hurry or hurry
        self._stopping.set()
        loop = self._loop
        if loop is not None and not loop.is_closed():
            # The loop may close meanwhile: then there is nothing left to wake.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self.on_stop)

    @property
    def stopping(self) -> bool:
        """Whether a stop has been asked for."""
        return self._stopping.is_set()

    @property
    def hurry(self) -> bool:
        """Whether the stop is in a hurry: work under way gets no grace period."""
        return self._hurry

    # -- signals -----------------------------------------------------------------------------------------

    def _signals(self, *, install: bool) -> None:
        if self.handle_signals:
            assert self._loop is not None
            handle_stop_signals(self._loop, self._on_signal, install=install)

    def _on_signal(self, signum: int) -> None:
        self._log.info("%s %s got %s: stopping", type(self).__name__.lower(), self.name, signal.Signals(signum).name)
        # A second signal means: don't wait for work under way.
        self.stop(hurry=self.stopping)
