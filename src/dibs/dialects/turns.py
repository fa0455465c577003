"""Writer turns: dibs's transactions on one SQLite file take its one write lock in turn, across threads and
processes, with no gap between one writer and the next.

SQLite lets one connection write at a time. A connection that finds the write lock taken waits in SQLite's
busy handler, which sleeps 1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50 and then 100 ms between looks. While
it sleeps the lock may be free, and a writer that happens to look at the right moment takes it again and
again. Eight worker processes draining one file showed both: two of them never claimed a job, and one
that claimed a batch in the first 0.03 s waited 1.2 s for the write of its successes, which was the end
of the drain.

So a dibs transaction on a file database first takes its turn: an exclusive ``flock`` on an empty file
beside the database, ``<database>-dibs-lock``, held from before its ``BEGIN IMMEDIATE`` until after its
``COMMIT`` or ``ROLLBACK``. The kernel wakes the next waiter the moment the lock is let go, so the write
lock passes from one dibs writer to the next at once, and each process gets its turns. ``flock`` is held
by an open file, not by a thread, so within a process threads take turns on a lock of their own first.

``flock`` has no timeout, yet a transaction must still give up after the connection's busy timeout, with
:class:`dibs.Busy`, as it would waiting on SQLite (a process stopped in its turn must not hang the others
for good). So the thread whose turn is next does not block in ``flock`` itself: a thread of the process's
turns blocks there for it and hands the lock over; when the asking thread stopped waiting, the lock goes to
the next thread of the process that asks, or is let go at once.

Writers other than dibs's (an application's own transactions) meet SQLite's lock and busy handler as
before. There are no turns (only SQLite's busy handler, as before) where there is no ``flock`` (Windows),
for a database in memory or named by a URI, on an asyncio engine (a wait would block its event loop),
and when the file beside the database cannot be opened.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy.engine import Connection, Dialect, Engine

from dibs._errors import Busy

if sys.platform != "win32":
    import fcntl

SUFFIX = "-dibs-lock"
log = logging.getLogger("dibs.sqlite")


class Turns:
    """One process's turns at the write lock of one SQLite file."""

    def __init__(self, lock_path: str) -> None:
        self.lock_path = lock_path
        self._fd = -1  # the lock file, opened at the first turn
        #: False once the lock file could not be opened or locked: no turns, SQLite's busy handler alone.
        self._usable = True
        #: Held by the thread of this process whose turn it is, or that waits for it.
        self._mine = threading.Lock()
        self._state = threading.Condition(threading.Lock())
        self._held = False  # this process holds the flock, for the thread that has _mine
        self._wanted = False  # the helper thread is to wait in flock
        self._asking = False  # a thread waits for the helper to hand it the flock
        self._helper: threading.Thread | None = None

    @contextmanager
    def turn(self, timeout: float) -> Iterator[None]:
        """This thread's turn, waited for up to ``timeout`` seconds (dibs.Busy after that)."""
        if not self._usable:
            yield
            return
        if not self._take(timeout):
            raise Busy(
                f"another writer kept its turn at this SQLite database past the busy timeout ({timeout:g} s); "
                "nothing was written. Retry, raise the timeout (connect_args={'timeout': seconds}), or move "
                "the workload to PostgreSQL."
            )
        try:
            yield
        finally:
            self._give_back()

    def _take(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        if not self._mine.acquire(timeout=timeout):
            return False
        with self._state:
            if self._fd < 0 and self._usable:
                self._open()
            if not self._usable:
                return True  # no turns: the caller goes on to SQLite's lock and its busy handler
            if not self._wanted:
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    self._held = True
                    return True
                except BlockingIOError:
                    self._wanted = True
                    self._start_helper()
                    self._state.notify_all()
                except OSError as error:  # a file system without flock
                    self._unusable(error)
                    return True
            self._asking = True
            try:
                while not self._held and self._usable:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._state.wait(remaining)
            finally:
                self._asking = False
            if self._held or not self._usable:
                return True
        self._mine.release()
        return False

    def _give_back(self) -> None:
        with self._state:
            if self._held:
                self._held = False
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._mine.release()

    def _open(self) -> None:
        try:
            self._fd = os.open(self.lock_path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as error:
            self._unusable(error)

    def _unusable(self, error: OSError) -> None:
        self._usable = False
        self._state.notify_all()
        log.warning(
            "dibs could not take turns with %s (%s): its SQLite writers wait on SQLite's busy handler alone",
            self.lock_path,
            error,
        )

    def _start_helper(self) -> None:
        if self._helper is None:
            self._helper = threading.Thread(target=self._wait_for_lock, name="dibs-sqlite-turns", daemon=True)
            self._helper.start()

    def _wait_for_lock(self) -> None:
        """The helper thread: waits in flock whenever a thread of this process wants the lock, and hands it
        over, or lets it go at once if that thread stopped waiting."""
        while True:
            with self._state:
                while not self._wanted:
                    self._state.wait()
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            except OSError as error:
                with self._state:
                    self._wanted = False
                    self._unusable(error)
                return
            with self._state:
                self._wanted = False
                if self._asking:
                    self._held = True
                    self._state.notify_all()
                else:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)

    def forget(self) -> None:
        """In a forked child: close the file inherited from the parent, whose lock is the parent's."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


#: The turns of each SQLite file of this process, by the path of its lock file.
_TURNS: dict[str, Turns] = {}
_TURNS_LOCK = threading.Lock()
#: The lock file of each engine's database (by its dialect, which the engine keeps for life).
_LOCK_PATHS: WeakKeyDictionary[Dialect, str] = WeakKeyDictionary()
#: The busy timeout of a driver connection, in seconds, in its pool record's info.
TIMEOUT_INFO = "dibs_busy_timeout"


def take_turns(engine: Engine) -> bool:
    """Have dibs's transactions on this engine's SQLite file take turns, where they can (see the module);
    whether they do."""
    database = engine.url.database
    if sys.platform == "win32" or engine.dialect.is_async or not database or database == ":memory:":
        return False
    if database.startswith("file:") or engine.url.query.get("uri"):
        return False
    _LOCK_PATHS[engine.dialect] = os.path.realpath(database) + SUFFIX
    return True


def writer_turn(conn: Connection) -> AbstractContextManager[None]:
    """The turn a dibs transaction on ``conn`` takes before its BEGIN IMMEDIATE (none where there are no
    turns)."""
    lock_path = _LOCK_PATHS.get(conn.dialect)
    if lock_path is None:
        return nullcontext()
    turns = _TURNS.get(lock_path)
    if turns is None:
        with _TURNS_LOCK:
            turns = _TURNS.setdefault(lock_path, Turns(lock_path))
    timeout: Any = conn.connection.info.get(TIMEOUT_INFO)
    return turns.turn(timeout if isinstance(timeout, float) else 5.0)


def _forget_all() -> None:
    global _TURNS_LOCK
    _TURNS_LOCK = threading.Lock()  # a parent's thread may have held it at the fork
    for turns in _TURNS.values():
        turns.forget()
    _TURNS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_all)
