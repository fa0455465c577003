"""SIGTERM and SIGINT as a request to stop, for the long-running parts (workers, relays)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def handle_stop_signals(loop: asyncio.AbstractEventLoop, handler: Callable[[int], None], *, install: bool) -> None:
    """Install (or remove) ``handler(signum)`` for SIGTERM and SIGINT on ``loop``; only the main thread
    can, so elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in STOP_SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            if install:
                loop.add_signal_handler(signum, handler, signum)
            else:
                loop.remove_signal_handler(signum)
