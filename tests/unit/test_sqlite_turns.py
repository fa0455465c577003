"""dibs's writers take turns at an SQLite file's write lock (dibs.dialects.turns).

"Another process" holding the turn is the test itself, holding the flock on the lock file through a file
of its own: an open file of its own is what another process would have. Each test fails on code without
turns, where the write would go ahead at once.
"""

from __future__ import annotations

import fcntl
import gc
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import dibs
from dibs.dialects import turns
from dibs.dialects.turns import SUFFIX, turns_of, writer_turn
from dibs.outbox.outbox import outbox as outbox_table
from tests.conformance.tables import fill, leased_columns, work_columns

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="flock turns are taken on POSIX systems only")


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "turns.sqlite"


def new_engine(path: Path, timeout: float = 10.0) -> sa.Engine:
    return dibs.create_engine(f"sqlite:///{path}", connect_args={"timeout": timeout})


@pytest.fixture
def work(path: Path) -> sa.Table:
    engine = new_engine(path)
    table = sa.Table("work", sa.MetaData(), *work_columns())
    table.create(engine)
    with engine.begin() as conn:
        conn.execute(table.insert(), fill(table, 3))
    engine.dispose()
    return table


@contextmanager
def turn_held_elsewhere(path: Path) -> Iterator[None]:
    """The turn at ``path``'s write lock, held as another process holds it."""
    fd = os.open(f"{path}{SUFFIX}", os.O_RDONLY | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # lets the lock go


def waiting_for_turns(*engines: sa.Engine) -> None:
    """Until a thread of each engine waits for its turn (the one another process holds)."""
    deadline = time.monotonic() + 30
    while not all((found := turns_of(engine)) is not None and found.waiting for engine in engines):
        assert time.monotonic() < deadline, "no thread came to wait for its turn"
        time.sleep(0.01)


def ready_ids(path: Path, table: sa.Table) -> list[int]:
    engine = sa.create_engine(f"sqlite:///{path}")
    with engine.connect() as conn:
        ids = list(conn.execute(sa.select(table.c.id).where(table.c.status == "ready").order_by(table.c.id)).scalars())
    engine.dispose()
    return ids


class Background:
    """A call in a thread of its own: when it returned, and what it returned or raised."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.returned_at = 0.0
        self._thread = threading.Thread(target=self._run, args=(call,))
        self._thread.start()

    def _run(self, call: Callable[[], Any]) -> None:
        try:
            self.result = call()
        except BaseException as error:
            self.error = error
        self.returned_at = time.monotonic()

    def join(self) -> Any:
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), "the call never returned"
        if self.error is not None:
            raise self.error
        return self.result

    def running(self) -> bool:
        return self._thread.is_alive()


def test_a_claim_waits_for_the_turn_another_process_holds_and_goes_on_when_it_is_let_go(
    path: Path, work: sa.Table
) -> None:
    engine = new_engine(path)
    with turn_held_elsewhere(path):
        claim = Background(
            lambda: dibs.claim(engine, work, where=work.c.status == "ready", set={"status": "taken"}, limit=10)
        )
        waiting_for_turns(engine)
        time.sleep(0.1)
        assert claim.running(), "the claim went ahead while another process held the turn"
        assert ready_ids(path, work) == [1, 2, 3]
        let_go = time.monotonic()
    rows = claim.join()
    assert claim.returned_at >= let_go
    assert [row.id for row in rows] == [1, 2, 3]
    assert ready_ids(path, work) == []
    engine.dispose()


def test_a_turn_that_does_not_come_within_the_busy_timeout_raises_busy_and_writes_nothing(
    path: Path, work: sa.Table
) -> None:
    engine = new_engine(path, timeout=0.2)
    with turn_held_elsewhere(path):
        started = time.monotonic()
        with pytest.raises(dibs.Busy, match="kept its turn at this SQLite database past the busy timeout"):
            dibs.claim(engine, work, where=work.c.status == "ready", set={"status": "taken"})
        assert time.monotonic() - started >= 0.15
    assert ready_ids(path, work) == [1, 2, 3]
    # The process's helper was still waiting in flock when the claim gave up; it lets the lock go once it
    # gets it, for another process to take.
    fd = os.open(f"{path}{SUFFIX}", os.O_RDONLY)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                assert time.monotonic() < deadline, "the process kept the turn nobody in it waited for"
                time.sleep(0.01)
    finally:
        os.close(fd)
    assert len(dibs.claim(engine, work, where=work.c.status == "ready", set={"status": "taken"}, limit=1)) == 1
    engine.dispose()


def test_lease_writes_enqueues_cancels_and_requeues_take_turns_too(path: Path) -> None:
    engine = new_engine(path)
    leased = sa.Table("leased", sa.MetaData(), *leased_columns())
    leased.create(engine)
    with engine.begin() as conn:
        conn.execute(leased.insert(), fill(leased, 2))
    leases = dibs.Leases(leased)
    held = leases.claim(engine, owner="me", duration=30, limit=2)
    app = dibs.App(f"sqlite:///{path}")

    @app.task(name="noop")
    def noop() -> None:
        return None

    app.init()
    waiting = app.enqueue("noop")
    outbox = dibs.Outbox(f"sqlite:///{path}")
    outbox.init()
    with engine.begin() as conn:
        event = outbox.add(conn, "order", 1, "order.placed", {})
        conn.execute(sa.update(outbox_table).values(status="abandoned"))
    with turn_held_elsewhere(path):
        writes = [
            Background(lambda: leases.complete_many(engine, held)),
            Background(lambda: app.enqueue("noop")),
            Background(lambda: app.cancel(waiting.id)),
            Background(lambda: outbox.requeue([event])),
        ]
        waiting_for_turns(engine, app.engine, outbox.engine)
        time.sleep(0.1)
        assert all(write.running() for write in writes), "a write went ahead while another process held the turn"
        let_go = time.monotonic()
    assert writes[0].join() == []  # no lease lost
    enqueued = writes[1].join()
    assert writes[2].join().status == "cancelled"
    assert writes[3].join() == 1
    assert all(write.returned_at >= let_go for write in writes)
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).where(leased.c.status == "done")).scalar_one() == 2
    assert app.get(enqueued.id).status == "queued"
    assert [found.status for found in outbox.events()] == ["pending"]
    for owner in (app, outbox):
        owner.engine.dispose()
    engine.dispose()


def test_threads_of_one_process_take_turns(path: Path, work: sa.Table) -> None:
    engine = new_engine(path, timeout=0.2)
    inside = threading.Event()
    leave = threading.Event()

    def hold(conn: sa.Connection, rows: list[Any]) -> None:
        inside.set()
        leave.wait(10)

    first = Background(lambda: dibs.claim(engine, work, where=work.c.id == 1, set={"status": "taken"}, then=hold))
    try:
        assert inside.wait(10)
        # This thread waits for the first one's turn, not on SQLite's lock behind it.
        with pytest.raises(dibs.Busy, match="kept its turn"):
            dibs.claim(engine, work, where=work.c.id == 2, set={"status": "taken"})
    finally:
        leave.set()
    assert [row.id for row in first.join()] == [1]
    assert [row.id for row in dibs.claim(engine, work, where=work.c.id == 2, set={"status": "taken"})] == [2]
    engine.dispose()


def test_a_write_inside_the_same_threads_turn_fails_at_once_saying_what_to_do(path: Path, work: sa.Table) -> None:
    engine = new_engine(path)  # a busy timeout of 10 s, which the nested write does not wait for

    def nested(conn: sa.Connection, rows: list[Any]) -> None:
        dibs.claim(engine, work, where=work.c.id == 2, set={"status": "taken"})

    started = time.monotonic()
    with pytest.raises(dibs.Busy, match=r"already holds its turn .* \(pass its connection, as conn=\)"):
        dibs.claim(engine, work, where=work.c.id == 1, set={"status": "taken"}, then=nested)
    assert time.monotonic() - started < 5
    assert ready_ids(path, work) == [1, 2, 3]
    engine.dispose()


class Interrupted(Exception):
    pass


def test_a_wait_for_a_turn_that_is_interrupted_leaves_the_turns_as_they_were(path: Path, work: sa.Table) -> None:
    engine = new_engine(path)

    def interrupt(signum: int, frame: Any) -> None:
        raise Interrupted

    before = signal.signal(signal.SIGALRM, interrupt)
    try:
        with turn_held_elsewhere(path):
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            with pytest.raises(Interrupted):
                dibs.claim(engine, work, where=work.c.status == "ready", set={"status": "taken"})
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
    # The interrupted thread let go of what it had taken: the next write takes its turn at once.
    started = time.monotonic()
    assert len(dibs.claim(engine, work, where=work.c.status == "ready", set={"status": "taken"}, limit=10)) == 3
    assert time.monotonic() - started < 5
    engine.dispose()


def test_a_lock_file_replaced_under_an_engine_is_opened_anew(
    path: Path, work: sa.Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(turns, "PLACE_CHECK", 0.0)
    engine = new_engine(path, timeout=0.2)
    assert len(dibs.claim(engine, work, where=work.c.id == 1, set={"status": "taken"})) == 1  # the file opened
    Path(f"{path}{SUFFIX}").unlink()
    # The turn held on a new lock file, which the engine has not opened.
    with turn_held_elsewhere(path), pytest.raises(dibs.Busy, match="kept its turn"):
        dibs.claim(engine, work, where=work.c.id == 2, set={"status": "taken"})
    assert ready_ids(path, work) == [2, 3]
    assert len(dibs.claim(engine, work, where=work.c.id == 2, set={"status": "taken"})) == 1
    engine.dispose()


def lock_files_open(path: Path) -> int:
    target = f"{path}{SUFFIX}"
    return sum(1 for fd in os.listdir("/proc/self/fd") if os.path.realpath(f"/proc/self/fd/{fd}") == target)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts open files in /proc")
def test_an_engine_let_go_leaves_no_lock_file_open_and_no_thread_behind(
    path: Path, work: sa.Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(turns, "HELPER_IDLE", 0.1)
    engine = new_engine(path, timeout=0.2)
    before = set(threading.enumerate())
    with turn_held_elsewhere(path), pytest.raises(dibs.Busy):  # the helper thread starts, to wait in flock
        dibs.claim(engine, work, where=work.c.id == 1, set={"status": "taken"})
    helpers = [thread for thread in set(threading.enumerate()) - before if thread.name == "dibs-sqlite-turns"]
    assert len(helpers) == 1
    assert lock_files_open(path) == 1
    engine.dispose()
    del engine
    deadline = time.monotonic() + 10
    while helpers[0].is_alive() or lock_files_open(path):
        assert time.monotonic() < deadline, "a helper thread or the lock file was kept"
        gc.collect()
        time.sleep(0.05)


# Forking a process with threads: Python 3.12 and later warn that the child may deadlock, which this test
# is about (the child must not inherit the parent's turn).
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_forked_child_takes_turns_of_its_own(path: Path, work: sa.Table) -> None:
    engine = new_engine(path, timeout=0.2)
    assert dibs.claim(engine, work, where=work.c.id == 0, set={"status": "taken"}) == []  # turns taken before
    parent_holds, told = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child process
        code = 3
        try:
            engine.dispose(close=False)
            os.read(parent_holds, 1)
            # A child that kept the parent's open lock file would hold the parent's turn too, and claim.
            dibs.claim(engine, work, where=work.c.status == "ready", set={"status": "taken"})
            code = 1
        except dibs.Busy as error:
            code = 0 if "kept its turn" in str(error) else 2
        finally:
            os._exit(code)
    with engine.connect() as conn, writer_turn(conn):
        os.write(told, b"x")
        _, status = os.waitpid(child, 0)
    os.close(parent_holds)
    os.close(told)
    assert os.waitstatus_to_exitcode(status) == 0, "the child did not wait for the parent's turn"
    assert ready_ids(path, work) == [1, 2, 3]
    engine.dispose()


def test_without_a_lock_file_writers_wait_on_sqlite_alone(
    path: Path, work: sa.Table, caplog: pytest.LogCaptureFixture
) -> None:
    # The lock file's name leads into a directory that does not exist: it cannot be made.
    Path(f"{path}{SUFFIX}").symlink_to(path.parent / "missing" / "lock")
    engine = new_engine(path)
    with caplog.at_level(logging.WARNING, logger="dibs.sqlite"):
        rows = dibs.claim(engine, work, where=work.c.status == "ready", set={"status": "taken"}, limit=10)
        assert [row.id for row in rows] == [1, 2, 3]
    assert "could not take turns" in caplog.text
    assert not (path.parent / "missing").exists()
    engine.dispose()


def test_no_turns_under_gevents_green_threads(path: Path) -> None:
    # The helper's wait in flock would stop every greenlet, the one holding the turn too.
    program = (
        "from gevent import monkey; monkey.patch_all()\n"
        "import sys, dibs\n"
        "from dibs.dialects.turns import turns_of\n"
        "engine = dibs.create_engine(sys.argv[1])\n"
        "print('turns' if turns_of(engine) is not None else 'none')\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", program, f"sqlite:///{path}"], capture_output=True, text=True, timeout=120, check=True
    )
    assert ran.stdout.strip() == "none", ran.stderr
    engine = new_engine(path)
    assert turns_of(engine) is not None  # without gevent, turns
    engine.dispose()
