"""What every part of the suite shares: the backends, waiting for a condition, a service in a thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

#: The database families every backend-parametrized test runs on.
BACKENDS = ("postgresql", "sqlite", "mariadb")

Stats = TypeVar("Stats", covariant=True)
Done = TypeVar("Done")


def wait_until(condition: Callable[[], Any], timeout: float = 20.0, interval: float = 0.02, what: str = "") -> Any:
    """Poll until ``condition()`` is truthy; its value, or AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        time.sleep(interval)


class Service(Protocol[Stats]):
    """A long-running dibs service: a worker or a relay."""

    name: str

    def run(self) -> Stats: ...


class ServiceThread(Generic[Done]):
    """A service running in a thread of this process; what its run returned, or what it raised, is kept."""

    def __init__(self, service: Service[Done], stop: Callable[[], None], kind: str) -> None:
        self.service = service
        self.kind = kind
        self.stats: Done | None = None
        self.error: BaseException | None = None
        self._stop = stop
        self.thread = threading.Thread(target=self._run, name=f"test-{kind}-{service.name}", daemon=True)

    def _run(self) -> None:
        try:
            self.stats = self.service.run()
        except BaseException as exc:
            self.error = exc

    @property
    def running(self) -> bool:
        return self.thread.is_alive()

    def join(self, timeout: float = 30.0) -> Done:
        """Wait for the service to end (burst, or stopped) and return what it did; fail if it does not."""
        self.thread.join(timeout)
        if self.thread.is_alive():
            self.stop()
            raise AssertionError(f"the {self.kind} did not finish within {timeout} s")
        if self.error is not None:
            raise self.error
        assert self.stats is not None
        return self.stats

    def stop(self, timeout: float = 15.0) -> None:
        if self.thread.is_alive():
            self._stop()
            self.thread.join(timeout)
