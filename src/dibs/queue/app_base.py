"""What every part of the App stands on: the database its jobs live in, its tasks and schedules, and the
translation of a statement's failure into SchemaMissing when the dibs tables are missing."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Engine

from dibs._checks import checked_integer, checked_name
from dibs.queue.enqueue import CHANNEL
from dibs.queue.job import Job
from dibs.queue.results import ResultWaiter
from dibs.queue.store import JobStore
from dibs.queue.transactional import checked_async_options
from dibs.schema import DibsDatabase, tables_checked

if TYPE_CHECKING:
    from dibs.queue.periodic import Periodic
    from dibs.queue.task import Task


class AppBase(DibsDatabase):
    """The App's database, tasks and schedules; see :class:`dibs.App`."""

    def __init__(
        self,
        db: str | Engine | None = None,
        *,
        queues: Iterable[str] = (),
        max_args_bytes: int = 1_000_000,
        notify: bool = True,
        async_engine_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(db)
        #: The registered tasks by name.
        self.tasks: dict[str, Task] = {}
        #: Queues declared beyond those the tasks name.
        self.declared_queues = frozenset(checked_name(queue, "a queue name") for queue in queues)
        #: The most bytes of JSON one job's arguments may take.
        self.max_args_bytes = checked_integer(max_args_bytes, "max_args_bytes", 1)
        #: Whether enqueueing wakes PostgreSQL workers with NOTIFY, and finishing jobs wakes those who wait
        #: for their results.
        self.notify = notify
        #: Options for the asyncio engine a worker opens on this database for async transactional tasks, as
        #: for :func:`dibs.create_async_engine` (an Engine given carries no record of its own options).
        self.async_engine_options = checked_async_options(async_engine_options)
        #: Periodic job schedules by name (see :meth:`dibs.App.periodic`).
        self.schedules: dict[str, Periodic] = {}
        self._store: JobStore | None = None
        self._results: ResultWaiter | None = None

    @property
    def store(self) -> JobStore:
        """The job store on :attr:`engine`: the statements workers and the App run on the jobs table."""
        if self._store is None:
            self._store = JobStore(self.engine, announce=self.notify)
        return self._store

    @property
    def queues(self) -> frozenset[str]:
        """Every queue a task names or the app declares."""
        return self.declared_queues | {task.queue for task in self.tasks.values()}

    def _waited(self, found: list[Job]) -> list[Job]:
        """These jobs, their results waited for by the App's one shared waiter."""
        if self._results is None:
            self._results = ResultWaiter(self.engine, listen=self.notify)
        waiter = self._results
        for job in found:
            job.waited_by(waiter)
        return found

    def _channel(self) -> str | None:
        return CHANNEL if self.notify else None

    def _tables(self) -> AbstractContextManager[None]:
        """Turn a statement's failure into SchemaMissing when the dibs tables are missing or out of date."""
        return tables_checked(self.engine)
