"""Workflows built on ``after=``: a chain (each step after the one before) and a group with a callback
(fan-out, then fan-in), each enqueued atomically: all of its jobs, or none, in the caller's transaction
when given one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

from dibs._errors import InvalidArgument
from dibs.queue.enqueue import NewJob, checked_parent_failure, insert_jobs, waiting_for
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
        validated = self._steps(steps, waiting=bool)  # every step but the first
        return self._write(conn, lambda connection: self._chain(connection, validated))

    async def achain(self, *steps: Step, conn: AsyncConnection | AsyncSession | None = None) -> list[Job]:
        """:meth:`chain` for asyncio; ``conn`` is an AsyncConnection or AsyncSession.

        Args:
            *steps: The jobs, in order.
            conn: An AsyncConnection or AsyncSession whose transaction the jobs join.

        Returns:
            The jobs as stored, in order.
        """
        validated = self._steps(steps, waiting=bool)
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
        members, callback = self._workflow(steps, then)
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
        members, callback = self._workflow(steps, then)
        return await self._awrite(conn, lambda connection: self._group(connection, members, callback))

    def _workflow(self, steps: Sequence[Step], then: Step | None) -> tuple[list[NewJob], NewJob | None]:
        """A group's checked members, which wait for nothing, and its callback, which waits for them."""
        members = self._steps(steps, waiting=lambda _: False)
        return members, None if then is None else self._steps([then], waiting=lambda _: True)[0]

    def _steps(self, steps: Sequence[Step], *, waiting: Callable[[int], bool]) -> list[NewJob]:
        """The checked steps; ``waiting(index)``: whether that step waits for others of the workflow."""
        if not steps or not all(isinstance(step, Step) for step in steps):
            raise InvalidArgument(f"a workflow takes one or more dibs.Step values, got {list(steps)!r}")
        return [self._step(step, waits=waiting(index)) for index, step in enumerate(steps)]

    def _step(self, step: Step, *, waits: bool) -> NewJob:
        options = dict(step.options)
        # The jobs a step waits for are known only as the workflow is inserted: its policy toward them is
        # checked here, and applied by waiting_for().
        policy = options.pop("on_parent_failure", None) if waits else None
        if waits and options.get("dedupe_key") is not None:
            raise InvalidArgument(
                f"a step that waits for others (a chain's later step, a group's callback) cannot have a "
                f"dedupe_key; got {options['dedupe_key']!r} for a {getattr(step.task, 'name', step.task)!r} step"
            )
        batch = self._validated(step.task, [step.args], options)
        assert batch is not None  # one argument set makes one job
        if policy is None:
            return batch.first
        values = {**batch.first.values, "on_parent_failure": checked_parent_failure(policy)}
        return NewJob(values=values, delay=batch.first.delay, run_at=batch.first.run_at, parents=batch.first.parents)

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
