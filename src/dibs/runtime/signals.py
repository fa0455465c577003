"""SIGTERM and SIGINT as a request to stop, for the long-running services (workers, relays, due runners)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def handle_stop_signals(loop: asyncio.AbstractEventLoop, handler: Callable[[int], None], *, install: bool) -> None:
    """Install (or remove) ``handler(signum)`` for SIGTERM and SIGINT on ``loop``.

    Only the main thread can handle signals, so in any other thread this does nothing.

    Args:
        loop: The running loop that calls the handler.
        handler: Called with the signal's number.
        install: True to install the handler, False to remove it.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in STOP_SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            if install:
                loop.add_signal_handler(signum, handler, signum)
            else:
                loop.remove_signal_handler(signum)
