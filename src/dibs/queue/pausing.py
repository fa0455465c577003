"""Pausing and resuming queues: a row in ``dibs_queues`` that every worker's claim reads.

A pause takes effect at each worker's next claim (jobs already claimed run to their end); a resume wakes
PostgreSQL workers with NOTIFY, so that they claim at once instead of at their next poll.
"""

from __future__ import annotations

import sqlalchemy as sa

from dibs._checks import checked_name
from dibs.dialects import backend_for
from dibs.engine import connected, writing
from dibs.queue.app_base import AppBase
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
