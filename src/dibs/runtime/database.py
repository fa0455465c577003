"""The threads that make a service's blocking database calls, so that its event loop never waits on one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import sqlalchemy as sa

T = TypeVar("T")

#: Turns a driver's error into the dibs error it means, or gives it back unchanged; runs on a database thread.
Translate = Callable[[sa.exc.DBAPIError], Exception]


class DatabaseThreads:
    """A pool of threads, one per database connection a service uses, that run its blocking calls.

    The database's statements run without the GIL, so a claim on one thread and a write on another overlap.

    Args:
        count: Threads (and so connections in use at once).
        name: Prefix of the threads' names.
        translate: Turns a driver error into the dibs error it means (a missing table into
            :class:`~dibs.SchemaMissing`); it runs on a database thread, since it may ask the database.

    Example:
        >>> threads = DatabaseThreads(2, name="dibs-db")
        >>> threads.shutdown()
    """

    def __init__(self, count: int, *, name: str, translate: Translate | None = None) -> None:
        self.count = count
        self._pool = ThreadPoolExecutor(count, thread_name_prefix=name)
        self._translate = translate

    async def call(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``function(*args, **kwargs)`` on one of the threads and return what it returns.

        Raises:
            Exception: What the function raised; a driver error is translated first, when a
                ``translate`` was given and knows it.
        """
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, lambda: function(*args, **kwargs))
        except sa.exc.DBAPIError as error:
            if self._translate is None:
                raise
            problem = await loop.run_in_executor(self._pool, self._translate, error)
            if problem is error:
                raise
            raise problem from error

    def shutdown(self, *, wait: bool = True) -> None:
        """Let the threads end once their calls are done (``wait``: block until they have)."""
        self._pool.shutdown(wait=wait)
