"""Workflows built on ``after=``: a chain (each step after the one before) and a group with a callback
(fan-out, then fan-in), each enqueued atomically: all of its jobs, or none, in the caller's transaction
when given one."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

from dibs._errors import InvalidArgument
from dibs.queue.enqueue import NewJob, insert_jobs, waiting_for
from dibs.queue.job import Job
from dibs.queue.producer import Enqueueing
from dibs.queue.task import Task

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session


@dataclass(frozen=True)
class Step:
    """One job of a workflow, not enqueued yet: a task, its arguments and its enqueue options.

    Attributes:
        task: The task, or its registered name.
        args: The job's arguments.
        options: Enqueue options (``queue``, ``priority``, ``delay``, ``on_parent_failure``...).

    Example:
        >>> app.chain(dibs.Step(fetch, {"url": url}), dibs.Step(parse), dibs.Step(store))
    """

    task: Task | str
    args: Mapping[str, Any] | None = None
    options: Mapping[str, Any] = field(default_factory=dict)


class Workflows(Enqueueing):
    """The App's chains and groups; see :class:`dibs.App`."""

    def chain(self, *steps: Step, conn: Connection | Session | None = None) -> list[Job]:
        """Enqueue jobs that run one after the other: each waits until the one before it succeeded.

        Every step's child reads its parent's result in ``context.parent_results[0]``. When a step dies
        or is cancelled, the steps after it are cancelled (unless a step says ``on_parent_failure="run"``).

        Args:
            *steps: The jobs, in order.
            conn: A Connection or Session whose transaction the jobs join (all or none).

        Returns:
            The jobs as stored, in order: the first queued, the others waiting.

        Raises:
            InvalidArgument: No steps, or a step is wrong (nothing was enqueued).

        Example:
            >>> last = app.chain(dibs.Step(fetch, {"url": url}), dibs.Step(parse))[-1]
            >>> last.result(timeout=30)
        """
        validated = self._steps(steps)
        return self._write(conn, lambda connection: self._chain(connection, validated))

    async def achain(self, *steps: Step, conn: AsyncConnection | AsyncSession | None = None) -> list[Job]:
        """:meth:`chain` for asyncio; ``conn`` is an AsyncConnection or AsyncSession.

        Args:
            *steps: The jobs, in order.
            conn: An AsyncConnection or AsyncSession whose transaction the jobs join.

        Returns:
            The jobs as stored, in order.
        """
        validated = self._steps(steps)
        return await self._awrite(conn, lambda connection: self._chain(connection, validated))

    def group(
        self, steps: Sequence[Step], *, then: Step | None = None, conn: Connection | Session | None = None
    ) -> list[Job]:
        """Enqueue jobs that run in parallel and, with ``then``, a callback that runs once they all succeeded.

        The callback reads their results, in the order of ``steps``, in ``context.parent_results``.

        Args:
            steps: The jobs that run in parallel.
            then: The job that waits for all of them.
            conn: A Connection or Session whose transaction the jobs join (all or none).

        Returns:
            The jobs as stored: those of ``steps`` in order, then the callback's.

        Raises:
            InvalidArgument: No steps, or a step is wrong (nothing was enqueued).

        Example:
            >>> jobs = app.group([dibs.Step(resize, {"size": s}) for s in (64, 128)], then=dibs.Step(publish))
        """
        members, callback = self._steps(steps), None if then is None else self._steps([then])[0]
        return self._write(conn, lambda connection: self._group(connection, members, callback))

    async def agroup(
        self, steps: Sequence[Step], *, then: Step | None = None, conn: AsyncConnection | AsyncSession | None = None
    ) -> list[Job]:
        """:meth:`group` for asyncio; ``conn`` is an AsyncConnection or AsyncSession.

        Args:
            steps: The jobs that run in parallel.
            then: The job that waits for all of them.
            conn: An AsyncConnection or AsyncSession whose transaction the jobs join.

        Returns:
            The jobs as stored: those of ``steps`` in order, then the callback's.
        """
        members, callback = self._steps(steps), None if then is None else self._steps([then])[0]
        return await self._awrite(conn, lambda connection: self._group(connection, members, callback))

    def _steps(self, steps: Sequence[Step]) -> list[NewJob]:
        if not steps or not all(isinstance(step, Step) for step in steps):
            raise InvalidArgument(f"a workflow takes one or more dibs.Step values, got {list(steps)!r}")
        return [self._step(step) for step in steps]

    def _step(self, step: Step) -> NewJob:
        batch = self._validated(step.task, [step.args], step.options)
        assert batch is not None  # one argument set makes one job
        return batch.first

    def _chain(self, conn: Connection, steps: list[NewJob]) -> list[Job]:
        made: list[Job] = []
        for new in steps:
            step = waiting_for(new, [made[-1].id]) if made else new
            made.extend(insert_jobs(conn, [step], self._channel()))
        return made

    def _group(self, conn: Connection, members: list[NewJob], callback: NewJob | None) -> list[Job]:
        made = insert_jobs(conn, members, self._channel())
        if callback is not None:
            made.extend(insert_jobs(conn, [waiting_for(callback, [job.id for job in made])], None))
        return made

    async def _awrite(self, conn: Any, work: Any) -> list[Job]:
        if conn is None:
            return await asyncio.to_thread(self._write, None, work)

        def write(sync: Any) -> list[Job]:
            return self._write(sync, work)

        result: list[Job] = await conn.run_sync(write)
        return result
