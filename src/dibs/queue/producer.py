"""The producer side of the App: enqueueing jobs alone, in bulk, or inside the caller's transaction."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

from dibs._errors import InvalidArgument
from dibs.engine import writing
from dibs.queue.app_base import AppBase
from dibs.queue.batch import Batch, insert_batch, new_batch
from dibs.queue.enqueue import task_named
from dibs.queue.job import Job
from dibs.queue.task import Task

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session


class Enqueueing(AppBase):
    """The App's enqueue methods; see :class:`dibs.App`."""

    def enqueue(
        self,
        task: Task | str,
        args: Mapping[str, Any] | None = None,
        /,
        *,
        conn: Connection | Session | None = None,
        **options: Any,
    ) -> Job:
        """Enqueue one job, in a transaction of its own or, with ``conn``, in the caller's.

        Args:
            task: The task, or its registered name.
            args: The job's arguments: a JSON object (a dict of str keys), or None for none.
            conn: A Connection or ORM Session whose transaction the job joins: it exists only once the
                caller commits, and not at all if the caller rolls back.
            **options: ``queue``, ``priority``, ``run_at`` (an aware datetime) or ``delay`` (seconds or a
                timedelta), ``max_attempts``, ``dedupe_key`` (a live job with the key is returned instead
                of a new one), ``ordering_key``, ``tag``, ``after`` (jobs or ids: the job waits, in
                state ``waiting``, until they all succeeded) and ``on_parent_failure`` (``"cancel"``, the
                default: cancelled when one of them dies or is cancelled; ``"run"``: runs anyway).

        Returns:
            The job as stored.

        Raises:
            UnknownTask: No task answers to ``task``.
            InvalidArgument: The arguments are not JSON, too large, or an option is wrong.
            SchemaMissing: The database lacks the dibs tables (run ``dibs init``).

        Example:
            >>> job = app.enqueue("emails.send_receipt", {"order_id": 7}, delay=60)
        """
        return self.enqueue_many(task, [args], conn=conn, **options)[0]

    def enqueue_many(
        self,
        task: Task | str,
        many_args: Iterable[Mapping[str, Any] | None],
        /,
        *,
        conn: Connection | Session | None = None,
        **options: Any,
    ) -> list[Job]:
        """Enqueue a job per argument set, in one round trip, with the same options; all or none.

        Args:
            task: The task, or its registered name.
            many_args: One argument dict (or None) per job.
            conn: A Connection or ORM Session whose transaction the jobs join.
            **options: As for :meth:`enqueue`, the same for every job.

        Returns:
            The jobs as stored, in the order of ``many_args``.

        Raises:
            UnknownTask: No task answers to ``task``.
            InvalidArgument: ``many_args`` is one dict, an argument set is not JSON, or an option is wrong.
            SchemaMissing: The database lacks the dibs tables (run ``dibs init``).
        """
        batch = self._validated(task, many_args, options)
        if batch is None:
            return []
        first = batch.first
        if (
            conn is None
            and len(batch.args) == 1
            and first.values["dedupe_key"] is None
            and not first.parents
            and self.store.backend.atomic_statements
        ):
            # One INSERT is atomic on its own: in autocommit it is one round trip instead of three (BEGIN,
            # INSERT, COMMIT), and the notification it sends is delivered with it.
            with (
                self._tables(),
                self.engine.connect() as connection,
                self.store.backend.one_statement(connection, owned=True),
            ):
                return self._waited(insert_batch(connection, batch, self._channel()))
        return self._write(conn, lambda connection: insert_batch(connection, batch, self._channel()))

    async def aenqueue(
        self,
        task: Task | str,
        args: Mapping[str, Any] | None = None,
        /,
        *,
        conn: AsyncConnection | AsyncSession | None = None,
        **options: Any,
    ) -> Job:
        """:meth:`enqueue` for asyncio; ``conn`` is an AsyncConnection or AsyncSession.

        Args:
            task: The task, or its registered name.
            args: The job's arguments, a JSON object.
            conn: An AsyncConnection or AsyncSession whose transaction the job joins.
            **options: As for :meth:`enqueue`.

        Returns:
            The job as stored.
        """
        return (await self.aenqueue_many(task, [args], conn=conn, **options))[0]

    async def aenqueue_many(
        self,
        task: Task | str,
        many_args: Iterable[Mapping[str, Any] | None],
        /,
        *,
        conn: AsyncConnection | AsyncSession | None = None,
        **options: Any,
    ) -> list[Job]:
        """:meth:`enqueue_many` for asyncio.

        Args:
            task: The task, or its registered name.
            many_args: One argument dict (or None) per job.
            conn: An AsyncConnection or AsyncSession whose transaction the jobs join.
            **options: As for :meth:`enqueue`.

        Returns:
            The jobs as stored.
        """
        batch = self._validated(task, many_args, options)
        if batch is None:
            return []
        if conn is None:
            return await asyncio.to_thread(self._write, None, lambda c: insert_batch(c, batch, self._channel()))

        def write(sync: Any) -> list[Job]:
            return self._write(sync, lambda c: insert_batch(c, batch, self._channel()))

        return await conn.run_sync(write)

    def _validated(
        self, task: Task | str, many_args: Iterable[Mapping[str, Any] | None], options: Mapping[str, Any]
    ) -> Batch | None:
        chosen = task_named(self.tasks, task, by_function=False)
        if isinstance(many_args, Mapping):
            raise InvalidArgument("enqueue_many takes a list of argument dicts, one per job; for one job use enqueue")
        try:
            known = self.queues if "queue" in options else frozenset()
            return new_batch(chosen, many_args, known_queues=known, max_args_bytes=self.max_args_bytes, **options)
        except TypeError as exc:
            raise InvalidArgument(
                f"{exc}; enqueue options are queue, priority, run_at, delay, max_attempts, dedupe_key, "
                "ordering_key, tag, after, on_parent_failure and conn"
            ) from exc

    def _write(self, conn: Any, work: Callable[[Connection], list[Job]]) -> list[Job]:
        with self._tables():
            return self._waited(self._write_on(conn, work))

    def _write_on(self, conn: Any, work: Callable[[Connection], list[Job]]) -> list[Job]:
        if conn is None:
            with writing(self.engine) as connection:
                return work(connection)
        if isinstance(conn, Connection):
            # Inside the caller's transaction, or the one this statement begins: the caller commits it.
            return work(conn)
        connection_of = getattr(conn, "connection", None)
        if callable(connection_of):  # an ORM Session: join its transaction; the caller commits
            return work(connection_of())
        raise InvalidArgument(
            f"conn must be a SQLAlchemy Connection or Session (AsyncConnection or AsyncSession for aenqueue), "
            f"got {type(conn).__name__}"
        )
