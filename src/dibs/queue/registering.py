"""Registering tasks and periodic schedules with the App, and the schedules' rows in the database."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, TypeVar, overload

from dibs._errors import DibsWarning, InvalidArgument
from dibs.queue.enqueue import task_named
from dibs.queue.periodic import PeriodicStatus, checked_periodic, enqueue_due, schedule_status, sync_schedules
from dibs.queue.producer import Enqueueing
from dibs.queue.task import OrderingKey, Task
from dibs.retry import DEFAULT_RETRY, Retry

F = TypeVar("F", bound=Callable[..., Any])


def _warn_script_task(task_name: str, stacklevel: int) -> None:
    warnings.warn(
        f"task {task_name!r} is defined in a script run as __main__: a worker that imports the script's "
        f"module names it {task_name.replace('__main__.', 'MODULE.', 1)!r} and never runs its jobs. "
        f"Give it a stable name (@app.task(name={task_name.split('.', 1)[1]!r})) or define it in an "
        "importable module",
        DibsWarning,
        stacklevel=stacklevel,
    )


class Registering(Enqueueing):
    """The App's task and schedule registration; see :class:`dibs.App`."""

    @overload
    def task(self, function: F, /) -> Task: ...

    @overload
    def task(
        self,
        *,
        name: str | None = None,
        queue: str = "default",
        priority: int = 0,
        max_attempts: int = 5,
        retry: Retry = DEFAULT_RETRY,
        timeout: timedelta | float | None = None,
        ordering_key: OrderingKey = None,
        tag: str | None = None,
        transactional: bool = False,
    ) -> Callable[[F], Task]: ...

    def task(  # type: ignore[misc]
        self,
        function: F | None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        priority: int = 0,
        max_attempts: int = 5,
        retry: Retry = DEFAULT_RETRY,
        timeout: timedelta | float | None = None,
        ordering_key: OrderingKey = None,
        tag: str | None = None,
        transactional: bool = False,
    ) -> Task | Callable[[F], Task]:
        """Register a sync or async function as a task, bare (``@app.task``) or with options.

        Args:
            function: The function, when used bare as ``@app.task``.
            name: The task's name; defaults to ``module.function``.
            queue: The queue its jobs go to unless enqueued with another.
            priority: Higher runs first within a queue (-1,000,000 to 1,000,000).
            max_attempts: How many times a job of it runs before it is dead.
            retry: When and how soon a failed job runs again.
            timeout: Seconds (or a timedelta) a run may take before it is stopped and counted failed.
            ordering_key: A job argument's name (or a function of the arguments) whose value orders jobs:
                jobs with the same key run one at a time, in enqueue order.
            tag: Only workers serving this tag take its jobs.
            transactional: Run the function in a transaction on the app's database, given as
                ``context.conn`` (an AsyncConnection for an async function), that commits its writes with
                the job's completion, fenced by the job's lease; see the how-to on transactional tasks.

        Returns:
            The :class:`~dibs.Task`, or a decorator that makes one.

        Raises:
            InvalidArgument: A task of that name is registered already, or an option is out of range.

        Example:
            >>> @app.task(queue="emails", max_attempts=3)
            ... def send_receipt(order_id: int) -> None: ...
        """

        defaults = {"queue": queue, "priority": priority, "max_attempts": max_attempts, "retry": retry}
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        defaults.update(timeout=seconds, ordering_key=ordering_key, tag=tag, transactional=transactional)

        # The warning points at the decorated function: register() is one call deeper under a bare @app.task.
        def register(chosen: F, stacklevel: int = 2) -> Task:
            return self._registered(chosen, name, stacklevel + 1, defaults)

        return register if function is None else register(function, stacklevel=3)

    def _registered(self, function: F, name: str | None, stacklevel: int, defaults: dict[str, Any]) -> Task:
        task_name = name or f"{function.__module__}.{function.__qualname__}"
        if name is None and task_name.startswith("__main__."):
            _warn_script_task(task_name, stacklevel + 1)
        if task_name in self.tasks:
            raise InvalidArgument(f"a task named {task_name!r} is already registered; give this one name=")
        task = Task(app=self, function=function, name=task_name, **defaults)
        self.tasks[task_name] = task
        return task

    def task_named(self, name: str | Task) -> Task:
        """The task registered under ``name``, or else the one task whose function is called ``name``.

        Args:
            name: A task's full name, its function's name (``slow`` for ``tasks.slow``), or a Task.

        Returns:
            The registered task.

        Raises:
            UnknownTask: No task, or several, answer to ``name``; the message lists this app's tasks.
        """
        return task_named(self.tasks, name)

    def periodic(
        self,
        *,
        every: timedelta | None = None,
        cron: str | None = None,
        name: str | None = None,
        args: Mapping[str, Any] | None = None,
        missed: str = "skip",
        **options: Any,
    ) -> Callable[[F | Task], Task]:
        """Register a function (or a task) to be enqueued once at every slot of a schedule.

        Workers enqueue one job per slot however many of them run.

        Args:
            every: Slots at whole multiples of this timedelta since the epoch (UTC).
            cron: Or slots of a cron expression (five fields, UTC); needs the ``cron`` extra.
            name: The schedule's name; defaults to the task's.
            args: The arguments of each job.
            missed: For slots that passed while no worker ran: ``skip`` (one job, for the latest) or
                ``catch_up`` (one per slot).
            **options: Enqueue options of each job: queue, priority, max_attempts, tag.

        Returns:
            A decorator that registers the schedule and returns the task.

        Raises:
            InvalidArgument: Neither or both of ``every`` and ``cron``, a bad expression or option, or a
                schedule of that name registered already.

        Example:
            >>> @app.periodic(every=timedelta(minutes=5))
            ... def refresh_feeds() -> None: ...
        """

        def register(function: F | Task) -> Task:
            task = function if isinstance(function, Task) else self.task(function)
            if task.app is not self:
                raise InvalidArgument(f"task {task.name!r} is registered with another app, not this one")
            try:
                definition = checked_periodic(
                    task, name=name, every=every, cron=cron, args=args, missed=missed, options=options
                )
            except InvalidArgument:
                if task is not function:  # registered just now: a bad schedule leaves no task behind
                    del self.tasks[task.name]
                raise
            if definition.name in self.schedules:
                raise InvalidArgument(f"a periodic job named {definition.name!r} is already registered; give name=")
            self.schedules[definition.name] = definition
            return task

        return register

    def enqueue_periodic(self) -> int:
        """Enqueue the jobs of every schedule whose slot has come (workers do this in their upkeep).

        Returns:
            How many jobs were enqueued.

        Raises:
            SchemaMissing: The database lacks the dibs tables (run ``dibs init``).
        """
        with self._tables():
            return enqueue_due(self.engine, self.schedules, self._channel())

    def sync_periodic(self) -> None:
        """Record this app's schedules in the database (workers do this as they start).

        Raises:
            SchemaMissing: The database lacks the dibs tables (run ``dibs init``).
        """
        with self._tables():
            sync_schedules(self.engine, self.schedules)

    def periodic_status(self) -> list[PeriodicStatus]:
        """Every schedule recorded in the database: its next slot, last slot and last job.

        Raises:
            SchemaMissing: The database lacks the dibs tables (run ``dibs init``).
        """
        with self._tables():
            return schedule_status(self.engine)
