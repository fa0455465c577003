"""The service base: run() refuses a running loop, stop() works from any thread and before the start, a
failure to start leaves no thread, and the readiness flag follows the run."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

import dibs
from dibs.runtime import DatabaseThreads, Service


class Sleeper(Service[str]):
    """Sleeps until stopped; records what it went through."""

    def __init__(self, *, fail_start: bool = False) -> None:
        super().__init__(
            name="sleeper",
            threads=DatabaseThreads(1, name="test-sleeper"),
            handle_signals=False,
            log=logging.getLogger("test"),
        )
        self.fail_start = fail_start
        self.seen: list[str] = []

    async def start(self) -> None:
        self.seen.append("start")
        if self.fail_start:
            raise ConnectionError("no database")

    async def serve(self) -> str:
        self.seen.append("ready" if self.ready.is_set() else "not ready")
        while not self.stopping:
            self.wakeup.clear()
            await self.wakeup.sleep(10.0)
        return "hurried" if self.hurry else "stopped"

    async def close(self) -> None:
        self.seen.append("close")


def test_run_inside_a_running_loop_raises_a_dibs_error_saying_to_await_arun() -> None:
    async def inside() -> None:
        Sleeper().run()

    with pytest.raises(dibs.InEventLoop, match=r"await sleeper\.arun\(\)") as raised:
        asyncio.run(inside())
    assert isinstance(raised.value, dibs.DibsError)
    assert isinstance(raised.value, RuntimeError)


def test_stop_from_another_thread_ends_the_run_at_once_and_clears_readiness() -> None:
    service = Sleeper()
    threading.Timer(0.1, service.stop).start()
    assert service.run() == "stopped"
    assert service.seen == ["start", "ready", "close"]
    assert not service.ready.is_set()


def test_a_hurried_stop_is_seen_by_the_service() -> None:
    service = Sleeper()
    threading.Timer(0.1, lambda: service.stop(hurry=True)).start()
    assert service.run() == "hurried"


def test_a_stop_asked_before_the_run_ends_it_once_started() -> None:
    service = Sleeper()
    service.stop()
    assert service.run() == "stopped"


def test_a_failed_start_raises_to_the_caller_and_shuts_the_threads() -> None:
    service = Sleeper(fail_start=True)
    with pytest.raises(ConnectionError):
        service.run()
    assert service.seen == ["start"]
    assert not service.ready.is_set()
    with pytest.raises(RuntimeError, match="shutdown"):
        asyncio.run(service.threads.call(print))
