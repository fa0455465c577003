"""The App: a registry of tasks on one database, and everything done to its jobs from outside a worker.

::

    app = dibs.App("postgresql+psycopg://localhost/shop")

    @app.task(queue="emails", max_attempts=3, retry=dibs.Retry(on=(ConnectionError,)))
    def send_receipt(order_id: int) -> None: ...

    send_receipt.enqueue({"order_id": 7})                       # its own transaction
    with engine.begin() as conn:                                # or the caller's: no commit, no job
        conn.execute(orders.insert(), ...)
        send_receipt.enqueue({"order_id": 8}, conn=conn)

The App is wiring: its database and tasks (``app_base``), registration of tasks and schedules
(``registering``), the producer side (``producer``), chains and groups (``workflows``), administration
(``admin``) and pausing queues (``pausing``).
"""

from __future__ import annotations

from typing import Any

from dibs.queue.admin import Administering, QueueStatus
from dibs.queue.pausing import Pausing
from dibs.queue.registering import Registering
from dibs.queue.worker import Worker
from dibs.queue.workflows import Workflows

__all__ = ["App", "QueueStatus"]


class App(Registering, Workflows, Administering, Pausing):
    """Tasks and the database their jobs live in.

    Args:
        db: An Engine, a database URL, or None for ``$DIBS_DATABASE_URL`` or else the SQLite file
            ``dibs.sqlite``. A URL no driver can serve is refused at once; a server that is down only
            when first used.
        queues: Queues beyond those the tasks name (jobs may be routed to any of them).
        max_args_bytes: The most bytes of JSON one job's arguments may take.
        notify: Whether enqueueing wakes PostgreSQL workers at once with NOTIFY, and workers announce
            finished jobs to those waiting for their results (who then LISTEN instead of polling).
        async_engine_options: Options for the asyncio engine a worker opens on this database when an async
            transactional task first runs, as for :func:`dibs.create_async_engine`: give it the options
            your Engine was made with (``connect_args`` and the like), which an Engine does not record. They
            must reach the same database and schema; ``isolation_level`` is refused.

    Raises:
        InvalidArgument: A bad URL, queue name, ``max_args_bytes`` or ``async_engine_options``.

    Example:
        >>> app = dibs.App("sqlite:///jobs.sqlite")
        >>> app.init()
        >>> @app.task
        ... def add(a: int, b: int) -> int:
        ...     return a + b
        >>> job = add.enqueue({"a": 1, "b": 2})
        >>> app.worker(burst=True).run()
    """

    def worker(self, **options: Any) -> Worker:
        """A worker for this app's tasks.

        Args:
            **options: As for :class:`dibs.Worker`.

        Returns:
            The worker, not yet running.
        """
        return Worker(self, **options)
