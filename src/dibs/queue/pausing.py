"""Pausing and resuming queues and periodic schedules.

A queue's pause is a row in ``dibs_queues`` that every worker's claim reads: it takes effect at each worker's
next claim (jobs already claimed run to their end); a resume wakes PostgreSQL workers with NOTIFY, so that
they claim at once instead of at their next poll.

A periodic schedule's pause is a flag on its row of ``dibs_periodic``: while it is set, its slots pass without
a job, and a resume makes up for none of them.
"""

from __future__ import annotations

import sqlalchemy as sa

from dibs._checks import checked_name
from dibs._errors import InvalidArgument
from dibs.dialects import backend_for
from dibs.engine import connected, writing
from dibs.queue.app_base import AppBase
from dibs.queue.periodic import set_paused, sync_schedules
from dibs.queue.task import TASK_NAME_LIMIT
from dibs.schema import queues

#: How many times a pause tries when another process inserts the same queue's row at the same moment.
_TRIES = 3


class Pausing(AppBase):
    """The App's pause and resume of queues; see :class:`dibs.App`."""

    def pause(self, queue: str) -> None:
        """Stop every worker from claiming this queue's jobs; those running finish.

        Jobs may still be enqueued on a paused queue: they wait until it is resumed.

        Args:
            queue: The queue's name (it need not have any job yet).

        Raises:
            InvalidArgument: ``queue`` is not a queue name.
            SchemaMissing: The database lacks the dibs tables (run ``dibs init``).

        Example:
            >>> app.pause("emails")
            >>> app.paused()
            ['emails']
        """
        self._set_paused(checked_name(queue, "a queue name"), paused=True)

    def resume(self, queue: str) -> None:
        """Let workers claim this queue's jobs again, at once.

        Resuming a queue that is not paused does nothing.

        Args:
            queue: The queue's name.

        Raises:
            InvalidArgument: ``queue`` is not a queue name.
            SchemaMissing: The database lacks the dibs tables (run ``dibs init``).

        Example:
            >>> app.resume("emails")
            >>> app.paused()
            []
        """
        self._set_paused(checked_name(queue, "a queue name"), paused=False)

    def paused(self) -> list[str]:
        """The paused queues, by name.

        Raises:
            SchemaMissing: The database lacks the dibs tables (run ``dibs init``).
        """
        query = sa.select(queues.c.name).where(queues.c.paused.is_(True)).order_by(queues.c.name)
        with self._tables(), connected(self.engine) as conn:
            return list(conn.execute(query).scalars())

    def _set_paused(self, queue: str, *, paused: bool) -> None:
        backend = backend_for(self.engine.dialect)
        values = {"paused": paused, "updated_at": backend.now()}
        update = sa.update(queues).where(queues.c.name == queue).values(**values)
        channel = self._channel()
        notify = backend.notify(channel) if channel and not paused else None
        for attempt in range(1, _TRIES + 1):
            try:
                with self._tables(), writing(self.engine) as conn:
                    if conn.execute(update).rowcount == 0 and paused:
                        conn.execute(sa.insert(queues).values(name=queue, **values))
                    if notify is not None:
                        conn.execute(notify, {"dibs_payload": queue})
                return
            except sa.exc.IntegrityError:  # another pause inserted the row first: update it now
                if attempt == _TRIES:
                    raise

    def pause_periodic(self, name: str) -> None:
        """Stop a periodic schedule from enqueueing jobs, on every worker, from its next slot.

        Its slots pass while it is paused (workers move it on past each one) and :meth:`resume_periodic`
        makes up for none of them.

        Args:
            name: The schedule's name, as :meth:`periodic_status` lists it.

        Raises:
            InvalidArgument: No schedule of that name is recorded in the database, nor registered with this app.
            SchemaMissing: The database lacks the dibs tables (run ``dibs init``).

        Example:
            >>> app.pause_periodic("refresh_feeds")
            >>> [schedule.paused for schedule in app.periodic_status()]
            [True]
        """
        self._set_schedule_paused(name, paused=True)

    def resume_periodic(self, name: str) -> None:
        """Let a paused periodic schedule enqueue its jobs again, from its next slot on.

        No job is enqueued for the slots that passed while it was paused. Resuming a schedule that is not
        paused does nothing.

        Args:
            name: The schedule's name.

        Raises:
            InvalidArgument: No schedule of that name is recorded in the database, nor registered with this app.
            SchemaMissing: The database lacks the dibs tables (run ``dibs init``).

        Example:
            >>> app.resume_periodic("refresh_feeds")
        """
        self._set_schedule_paused(name, paused=False)

    def _set_schedule_paused(self, name: str, *, paused: bool) -> None:
        chosen = checked_name(name, "a periodic job's name", TASK_NAME_LIMIT)
        with self._tables():
            if set_paused(self.engine, chosen, paused=paused):
                return
            if chosen in self.schedules:
                # Registered here but not recorded yet (no worker started since): recorded first. One already
                # recorded keeps its definition, which the running workers' version may not share with this app.
                sync_schedules(self.engine, {chosen: self.schedules[chosen]})
                if set_paused(self.engine, chosen, paused=paused):
                    return
        raise InvalidArgument(
            f"no periodic job named {chosen!r} is recorded in this database: `dibs periodic list` shows those that are "
            "(a worker records its app's schedules as it starts)"
        )
