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
``COMMIT`` or ``ROLLBACK``. The kernel wakes the waiters the moment the lock is let go, so the write lock
passes from one dibs writer to another at once, and each process gets its turns. ``flock`` is held by an
open file, not by a thread: each engine opens the lock file once, and its threads take turns on a lock of
their own first. Two engines on one file, in one process or two, exclude each other through the kernel.

``flock`` has no timeout, yet a transaction must still give up after the connection's busy timeout, with
:class:`dibs.Busy`, as it would waiting on SQLite (a process stopped in its turn must not hang the others
for good). So the thread whose turn is next does not block in ``flock`` itself: a helper thread of the
engine blocks there for it and hands the lock over; when the asking thread stopped waiting, the lock goes
to the next thread that asks, or is let go at once. The helper ends after a few idle seconds.

Writers other than dibs's (an application's own transactions) meet SQLite's lock and busy handler as
before. There are no turns (only SQLite's busy handler, as before) where there is no ``flock`` (Windows,
some network file systems), for a database in memory or named by a URI, on an asyncio engine (a wait
would block its event loop), where gevent or eventlet made threads green (the same), and when the lock
file cannot be created. The lock file must stay while dibs's processes run: one that was replaced is
opened anew.
"""

from __future__ import annotations

import errno
import logging
import os
import sys
import threading
import time
from contextlib import AbstractContextManager, nullcontext
from types import TracebackType
from typing import Any
from weakref import WeakKeyDictionary, finalize

from sqlalchemy.engine import Connection, Dialect, Engine

from dibs._errors import Busy

if sys.platform != "win32":
    import fcntl

SUFFIX = "-dibs-lock"
#: Seconds a helper thread waits for another turn to wait for before it ends.
HELPER_IDLE = 5.0
#: Seconds between looks at whether the lock file is still the one this engine opened.
PLACE_CHECK = 1.0
#: Errors opening the lock file that may pass (too many open files): that write goes without a turn.
_PASSING = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EINTR}
log = logging.getLogger("dibs.sqlite")


class Turns:
    """One engine's turns at the write lock of one SQLite file."""

    def __init__(self, lock_path: str) -> None:
        self.lock_path = lock_path
        self._reset()

    def _reset(self) -> None:
        self._fd = -1  # the lock file, opened at the first turn
        self._closer: finalize[Any, Any] | None = None
        self._checked = 0.0  # when the lock file was last found in place
        #: False once the lock file could not be made or locked: no turns, SQLite's busy handler alone.
        self._usable = True
        #: Held by the thread whose turn it is, or that waits for it; _owner is that thread.
        self._mine = threading.Lock()
        self._owner: int | None = None
        self._state = threading.Condition(threading.Lock())
        self._held = False  # the lock file is locked, for the thread that has _mine
        self._wanted = False  # the helper is to wait in flock (only while the flock is not held)
        self._asking = False  # a thread waits for the helper to hand it the flock
        self._helper: threading.Thread | None = None

    @property
    def waiting(self) -> bool:
        """Whether a thread waits for a turn that is elsewhere."""
        return self._asking

    def turn(self, timeout: float) -> _Turn:
        """This thread's turn, as a context manager: waited for up to ``timeout`` seconds (dibs.Busy after
        that), let go when the block ends."""
        return _Turn(self, timeout)

    def take(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for this thread's turn: True when taken (give it back), False
        when there are no turns to take; dibs.Busy when it did not come."""
        me = threading.get_ident()
        if self._owner == me:
            raise Busy(
                "this thread already holds its turn at this SQLite database, in another dibs transaction that "
                "has the write lock; a second one would wait for the first forever. Write in that transaction "
                "(pass its connection, as conn=) or after it; nothing was written."
            )
        if not self._usable:
            return False
        deadline = time.monotonic() + timeout
        if not self._mine.acquire(timeout=timeout):
            raise self._busy(timeout)
        try:
            taken = self._lock(deadline)
        except BaseException:  # interrupted (KeyboardInterrupt): let go of whatever was taken
            with self._state:
                self._unlock()
            self._mine.release()
            raise
        if taken is None:
            self._mine.release()
            return False
        if not taken:
            self._mine.release()
            raise self._busy(timeout)
        self._owner = me
        return True

    def give_back(self) -> None:
        """Let the turn go (after :meth:`take` returned True)."""
        self._owner = None
        try:
            with self._state:
                self._unlock()
        finally:
            self._mine.release()

    def _lock(self, deadline: float) -> bool | None:
        """Lock the lock file, by this thread or through the helper, until ``deadline``: True when locked,
        False when the time ran out, None when there are no turns (this time, or for good)."""
        with self._state:
            while True:
                if self._fd < 0 and not self._open():
                    return None
                if not self._wanted:
                    try:
                        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        self._held = True
                    except BlockingIOError:
                        self._wanted = True
                        self._start_helper()
                        self._state.notify_all()
                    except OSError as error:  # a file system without flock
                        self._unusable(error)
                        return None
                if not self._held and not self._wait(deadline):
                    return False if self._usable else None
                if self._in_place():
                    return True
                # Another took the lock file's place: what this engine locked excludes nobody. Again, anew.
                self._unlock()
                self._close()

    def _wait(self, deadline: float) -> bool:
        """Wait for the helper to hand over the lock, until ``deadline``; whether it did. A thread that stops
        waiting (the time ran out, or it was interrupted) leaves the lock to the next asker, or to be let go."""
        self._asking = True
        try:
            while not self._held and self._usable:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._state.wait(remaining)
        finally:
            self._asking = False
        return self._held

    def _unlock(self) -> None:
        if self._held:
            self._held = False
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _open(self) -> bool:
        try:
            fd = os.open(self.lock_path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as error:
            if error.errno not in _PASSING:
                self._unusable(error)
            return False
        self._fd = fd
        self._closer = finalize(self, os.close, fd)
        self._checked = time.monotonic()
        return True

    def _close(self) -> None:
        if self._closer is not None:
            self._closer()
        self._closer = None
        self._fd = -1

    def _in_place(self) -> bool:
        """Whether the locked file is still the one at the lock file's path (it was not deleted or replaced
        while this engine had it open), looked at once a second at most."""
        now = time.monotonic()
        if now - self._checked < PLACE_CHECK:
            return True
        try:
            there = os.stat(self.lock_path)
        except OSError:
            return False
        mine = os.fstat(self._fd)
        if (mine.st_dev, mine.st_ino) != (there.st_dev, there.st_ino):
            return False
        self._checked = now
        return True

    def _unusable(self, error: OSError) -> None:
        self._usable = False
        self._state.notify_all()
        log.warning(
            "dibs could not take turns with %s (%s): its SQLite writers wait on SQLite's busy handler alone",
            self.lock_path,
            error,
        )

    @staticmethod
    def _busy(timeout: float) -> Busy:
        return Busy(
            f"another writer kept its turn at this SQLite database past the busy timeout ({timeout:g} s); "
            "nothing was written. Retry, raise the timeout (connect_args={'timeout': seconds}), or move the "
            "workload to PostgreSQL."
        )

    def _start_helper(self) -> None:
        if self._helper is None:
            self._helper = threading.Thread(target=self._help, name="dibs-sqlite-turns", daemon=True)
            self._helper.start()

    def _help(self) -> None:
        """The helper thread: waits in flock whenever a thread wants the lock, and hands it over, or lets it go
        at once if that thread stopped waiting. Ends after HELPER_IDLE seconds with nothing to wait for."""
        while True:
            with self._state:
                if not self._wanted:
                    self._state.wait(HELPER_IDLE)
                if not self._wanted:
                    self._helper = None
                    return
                fd = self._fd
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as error:
                with self._state:
                    self._wanted = False
                    self._helper = None
                    self._unusable(error)
                return
            with self._state:
                if self._asking:
                    self._held = True
                    self._state.notify_all()
                else:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                self._wanted = False

    def forget(self) -> None:
        """In a forked child: close the file inherited from the parent (its lock is the parent's) and start
        afresh (a parent's thread may have held the turn, or waited for it, when it forked)."""
        if self._closer is not None:
            self._closer.detach()
        if self._fd >= 0:
            os.close(self._fd)
        self._reset()


class _Turn:
    """A turn taken for a ``with`` block."""

    __slots__ = ("taken", "timeout", "turns")

    def __init__(self, turns: Turns, timeout: float) -> None:
        self.turns = turns
        self.timeout = timeout
        self.taken = False

    def __enter__(self) -> None:
        self.taken = self.turns.take(self.timeout)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self.taken:
            self.turns.give_back()


_NO_TURN = nullcontext()
#: Each engine's turns, by its dialect (which the engine keeps for life, and shares with its copies).
_TURNS: WeakKeyDictionary[Dialect, Turns] = WeakKeyDictionary()
#: The busy timeout of a driver connection, in seconds, in its pool record's info.
TIMEOUT_INFO = "dibs_busy_timeout"


def take_turns(engine: Engine) -> bool:
    """Have dibs's transactions on this engine's SQLite file take turns, where they can (see the module);
    whether they do."""
    database = engine.url.database
    if sys.platform == "win32" or engine.dialect.is_async or not database or database == ":memory:":
        return False
    if _green_threads():
        return False
    if database.startswith("file:") or engine.url.query.get("uri"):
        return False
    _TURNS[engine.dialect] = Turns(os.path.realpath(database) + SUFFIX)
    return True


def _green_threads() -> bool:
    """Whether gevent or eventlet made threads green: the helper's wait in flock would then stop every
    greenlet of the process, the one holding the turn too."""
    gevent = sys.modules.get("gevent.monkey")
    if gevent is not None and gevent.is_module_patched("threading"):
        return True
    eventlet = sys.modules.get("eventlet.patcher")
    return bool(eventlet is not None and eventlet.is_monkey_patched("thread"))


def turns_of(engine: Engine) -> Turns | None:
    """The engine's turns, if it takes them."""
    return _TURNS.get(engine.dialect)


def writer_turn(conn: Connection) -> AbstractContextManager[None]:
    """The turn a dibs transaction on ``conn`` takes before its BEGIN IMMEDIATE (none where there are no
    turns): a context manager."""
    turns = _TURNS.get(conn.dialect)
    if turns is None:
        return _NO_TURN
    timeout = conn.connection.info.get(TIMEOUT_INFO)
    return turns.turn(timeout if isinstance(timeout, float) else 5.0)


def _forget_all() -> None:
    for turns in list(_TURNS.values()):
        turns.forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_all)
