"""``dibs.django.DibsBackend``: Django's task framework on dibs workers.

Each ``@task`` function runs as a job of one dibs task, ``django.task``, whose arguments name the function by
its module path. Enqueueing writes the job on Django's own connection, in the transaction Django has open
there, so a request that rolls back enqueues nothing.
"""

from __future__ import annotations

import json
import threading
from datetime import datetime, timezone
from typing import Any

from django.conf import settings

from dibs.django.database import joined, url_of
from dibs.django.framework import (
    BaseTaskBackend,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
)
from dibs.queue.app import App
from dibs.queue.job import Job, JobContext

#: The dibs task every Django task runs as.
TASK = "django.task"

#: How a job's state reads as a Django task result's status: a job waiting for other jobs is as ready as a
#: scheduled one, and a cancelled job did not succeed.
STATUSES = {
    "waiting": TaskResultStatus.READY,
    "scheduled": TaskResultStatus.READY,
    "queued": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "succeeded": TaskResultStatus.SUCCESSFUL,
    "dead": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}


class DibsBackend(BaseTaskBackend):  # type: ignore[misc]
    """A backend for Django's task framework that runs tasks on dibs workers (``manage.py dibs_worker``).

    ``OPTIONS``: ``DATABASE`` (the alias of the Django database that holds the dibs tables and in whose
    transaction jobs are enqueued, default ``"default"``), ``MAX_ATTEMPTS`` (default 1: a Django task runs
    once unless it asks for more).

    Results carry the job's status, times, errors (the last run's, with its traceback) and, once the task
    succeeded, its return value as JSON makes it (``return_value``; tuples come back as lists), read with
    ``get_result(id)`` or ``result.refresh()`` by any process on the database.
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.database: str = self.options.get("DATABASE", "default")
        self.max_attempts: int = int(self.options.get("MAX_ATTEMPTS", 1))
        self._app: App | None = None

    @property
    def app(self) -> App:
        """The dibs App on the Django database, with the task every Django task runs as."""
        if self._app is None:
            from django.db import connections

            url = url_of(connections[self.database].settings_dict).render_as_string(hide_password=False)
            self._app = _app_for(url, sorted(self.queues), self.max_attempts)
        return self._app

    def enqueue(self, task: Task, args: list[Any], kwargs: dict[str, Any]) -> TaskResult:
        """Write the task's job in the transaction Django has open on the backend's database."""
        self.validate_task(task)
        options: dict[str, Any] = {"queue": task.queue_name, "priority": task.priority}
        if task.run_after is not None:
            options["run_at"] = task.run_after
        arguments = {"path": task.module_path, "args": list(args), "kwargs": dict(kwargs)}
        with joined(self.database) as conn:
            job = self.app.enqueue(TASK, arguments, conn=conn, **options)
        return self._result(task, job)

    def get_result(self, result_id: str) -> TaskResult:
        """The result of the job with this id, as it stands."""
        from django.utils.module_loading import import_string

        from dibs._errors import JobNotFound

        try:
            job = self.app.get(int(result_id))
        except (JobNotFound, ValueError) as exc:
            raise TaskResultDoesNotExist(result_id) from exc
        if job.task != TASK:  # a job of the dibs app itself, not of a Django task
            raise TaskResultDoesNotExist(result_id)
        task = import_string(job.args["path"])
        return self._result(task, job)

    def _result(self, task: Task, job: Job) -> TaskResult:
        status = STATUSES[job.status]
        result = TaskResult(
            task=task,
            id=str(job.id),
            status=status,
            enqueued_at=_local(job.enqueued_at),
            started_at=_local(job.started_at),
            finished_at=_local(job.finished_at),
            last_attempted_at=_local(job.started_at),
            args=job.args["args"],
            kwargs=job.args["kwargs"],
            backend=self.alias,
            errors=[_error(job.last_error)] if job.last_error else [],
            worker_ids=[job.lease_owner] if job.lease_owner else [],
        )
        if status == TaskResultStatus.SUCCESSFUL and job.result_json is not None:
            # The framework's results are frozen and keep their value where only its backends set it.
            object.__setattr__(result, "_return_value", json.loads(job.result_json))
        return result


#: Django makes a backend per thread: they share one App (and its engine) per database and settings.
_apps: dict[tuple[str, tuple[str, ...], int], App] = {}
_apps_lock = threading.Lock()


def _app_for(url: str, queues: list[str], max_attempts: int) -> App:
    key = (url, tuple(queues), max_attempts)
    with _apps_lock:
        if key not in _apps:
            app = App(url, queues=queues)
            app.task(name=TASK, max_attempts=max_attempts)(run_task)
            _apps[key] = app
        return _apps[key]


def run_task(path: str, args: list[Any], kwargs: dict[str, Any], context: JobContext) -> Any:
    """Run the Django task at ``path`` (the body of the dibs task every Django task runs as); its return value,
    normalized to JSON as the framework does, is kept as the job's result."""
    from django.utils.module_loading import import_string

    task: Task = import_string(path)
    if task.takes_context:
        result = task.get_backend().get_result(str(context.job_id))
        returned = task.call(TaskContext(task_result=result), *args, **kwargs)
    else:
        returned = task.call(*args, **kwargs)
    return normalize_json(returned)


def _local(moment: datetime | None) -> datetime | None:
    if moment is None or settings.USE_TZ:
        return moment
    return moment.astimezone(timezone.utc).replace(tzinfo=None)


def _error(last_error: str) -> TaskError:
    """The error of a failed job: its traceback, and the exception class its last line names."""
    last_line = last_error.strip().splitlines()[-1] if last_error.strip() else ""
    name = last_line.split(":", 1)[0].strip()
    path = name if "." in name else f"builtins.{name or 'Exception'}"
    return TaskError(exception_class_path=path, traceback=last_error)
