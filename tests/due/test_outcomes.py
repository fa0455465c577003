"""What a run leaves behind: done stamps the database clock, a failure keeps its error and waits by the normal
rule or for retry_after, release gives a row back unrun; run() and arun() isolate each handler's errors."""

from __future__ import annotations

import asyncio
import gc
import itertools
import threading
import time
import warnings
from datetime import timedelta
from typing import Any

import pytest

import dibs
from tests.due.sources import Sources
from tests.due.support import HOUR, aware, database_now
from tests.helpers import wait_until


def claimed_ids(scheduler: dibs.DueScheduler, sources: Sources, limit: int = 100) -> list[int]:
    return [lease.key[0] for lease in scheduler.claim(sources.engine, owner="tester", limit=limit)]


# -- done, release ---------------------------------------------------------------------------------------


def test_done_stamps_the_database_clock_and_clears_the_last_error(sources: Sources) -> None:
    sources.add({"id": 1, "last_run_at": sources.ago(7200)}, {"id": 2})
    sources.update(1, last_error="ValueError: from the run before")
    scheduler = sources.scheduler(interval=HOUR)
    leases = scheduler.claim(sources.engine, owner="tester", limit=10)
    assert sorted(lease.key[0] for lease in leases) == [1, 2]
    before = database_now(sources.engine)
    assert scheduler.complete(sources.engine, leases) == []
    after = database_now(sources.engine)
    for source in (1, 2):
        row = sources.row(source)
        last_run = aware(row.last_run_at)
        assert last_run is not None
        assert before <= last_run <= after
        assert (row.last_error, row.lease_status, row.lease_expires_at, row.run_count) == (None, "idle", None, 1)
    assert scheduler.due_rows(sources.engine) == []
    assert claimed_ids(scheduler, sources) == []


def test_release_gives_a_row_back_due_at_once_and_its_run_uncounted(sources: Sources) -> None:
    sources.add({"id": 1, "last_run_at": sources.ago(7200)})
    scheduler = sources.scheduler(interval=HOUR)
    held = scheduler.claim(sources.engine, owner="tester", limit=1)
    assert sources.row(1).run_count == 1
    assert scheduler.due_rows(sources.engine) == []
    assert scheduler.release(sources.engine, held) == []
    row = sources.row(1)
    assert (row.lease_status, row.lease_owner, row.lease_expires_at) == ("idle", None, None)
    assert (row.run_count, row.lease_token) == (0, 1)
    assert aware(row.last_run_at) == aware(held[0].row.last_run_at)  # still the old run
    assert [row.id for row in scheduler.due_rows(sources.engine)] == [1]
    (again,) = scheduler.claim(sources.engine, owner="tester", limit=1)
    assert (again.token, again.row.run_count) == (2, 1)
    assert scheduler.release(sources.engine, held) == held  # the old lease is gone
    assert scheduler.complete(sources.engine, [again]) == []


# -- failures --------------------------------------------------------------------------------------------


def test_a_handler_that_raises_fails_its_source_only(sources: Sources) -> None:
    sources.add(*[{"id": n} for n in range(1, 6)])
    scheduler = sources.scheduler(interval=60)
    seen: list[int] = []

    def handler(row: Any) -> None:
        seen.append(row.id)
        if row.id == 3:
            raise ValueError("feed 3 answered 500")

    before = database_now(sources.engine)
    stats = scheduler.run(sources.engine, handler, max_sources=100)
    after = database_now(sources.engine)
    assert sorted(seen) == [1, 2, 3, 4, 5]
    assert (stats.claimed, stats.succeeded, stats.failed, stats.lost) == (5, 4, 1, 0)
    assert stats.errors == {3: "ValueError: feed 3 answered 500"}

    rows = sources.rows()
    failed = rows.pop(3)
    assert failed.last_error.startswith("ValueError: feed 3 answered 500")
    assert "Traceback" in failed.last_error
    assert "in handler" in failed.last_error
    assert (failed.lease_status, failed.run_count) == ("idle", 1)
    last_run = aware(failed.last_run_at)
    assert last_run is not None
    assert before <= last_run <= after  # due again by the normal rule
    for row in rows.values():
        assert (row.last_error, row.lease_status, row.run_count) == (None, "idle", 1)
        assert row.last_run_at is not None

    # An interval of 60 s: nothing is due again now, the failed source included.
    assert scheduler.due_rows(sources.engine) == []
    assert claimed_ids(scheduler, sources) == []
    assert scheduler.run(sources.engine, handler) == dibs.DueStats()


def test_a_long_error_is_kept_cut_to_the_limit(sources: Sources) -> None:
    sources.add({"id": 1})
    scheduler = sources.scheduler(interval=HOUR)

    def handler(row: Any) -> None:
        raise ValueError("é" * 50_000)

    stats = scheduler.run(sources.engine, handler)
    assert stats.failed == 1
    kept = sources.row(1).last_error
    assert len(kept) == dibs.due.ERROR_LIMIT
    assert kept == ("ValueError: " + "é" * 50_000)[: dibs.due.ERROR_LIMIT]


def test_a_failed_source_comes_back_after_retry_after_not_before(sources: Sources) -> None:
    sources.add({"id": 1}, {"id": 2, "last_run_at": sources.ago(2 * 3600)}, {"id": 3, "last_run_at": sources.ago(5)})
    scheduler = sources.scheduler(interval=HOUR, retry_after=timedelta(seconds=1))

    def handler(row: Any) -> None:
        raise ConnectionError(f"source {row.id} unreachable")

    began = time.monotonic()
    stats = scheduler.run(sources.engine, handler)
    failed_by = time.monotonic()
    assert (stats.claimed, stats.failed) == (2, 2)
    assert stats.errors == {1: "ConnectionError: source 1 unreachable", 2: "ConnectionError: source 2 unreachable"}
    for source in (1, 2):
        assert sources.row(source).last_error.startswith(f"ConnectionError: source {source} unreachable")

    # Neither is due at once, though one never ran and the other is two hours late.
    assert claimed_ids(scheduler, sources) == []
    time.sleep(max(0.0, began + 0.6 - time.monotonic()))
    assert claimed_ids(scheduler, sources) == []
    # Each comes back a second after its own failure (they failed one after the other).
    back: list[dibs.Lease] = []

    def both_back() -> bool:
        taken = scheduler.claim(sources.engine, owner="tester", limit=10)
        if taken and not back:
            assert time.monotonic() - began >= 0.95, "a failed source came back before retry_after"
        back.extend(taken)
        return len(back) >= 2

    wait_until(both_back, timeout=5, interval=0.02, what="the failed sources to come back")
    assert time.monotonic() - failed_by <= 2.5
    assert sorted(lease.key[0] for lease in back) == [1, 2]  # and 3, not due, stays out
    assert claimed_ids(scheduler, sources) == []
    assert scheduler.complete(sources.engine, back) == []
    assert [sources.row(source).last_error for source in (1, 2)] == [None, None]


def test_a_source_that_keeps_failing_is_retried_each_time(sources: Sources) -> None:
    sources.add({"id": 1})
    scheduler = sources.scheduler(interval=HOUR, retry_after=0.2)
    calls: list[float] = []

    def handler(row: Any) -> None:
        calls.append(time.monotonic())
        raise RuntimeError(f"attempt {len(calls)}")

    deadline = time.monotonic() + 5
    while len(calls) < 3 and time.monotonic() < deadline:
        scheduler.run(sources.engine, handler)
        time.sleep(0.02)
    assert len(calls) == 3
    assert all(later - earlier >= 0.18 for earlier, later in itertools.pairwise(calls))
    row = sources.row(1)
    assert row.last_error.startswith("RuntimeError: attempt 3")
    assert row.run_count == 3


# -- run() and arun() ------------------------------------------------------------------------------------


def test_run_takes_at_most_max_sources(sources: Sources) -> None:
    sources.add(*[{"id": n} for n in range(1, 11)])
    scheduler = sources.scheduler(interval=HOUR)
    seen: list[int] = []
    stats = scheduler.run(sources.engine, lambda row: seen.append(row.id), max_sources=4, concurrency=3)
    assert (stats.claimed, stats.succeeded) == (4, 4)
    assert len(set(seen)) == 4
    assert len(scheduler.due_rows(sources.engine)) == 6
    stats = scheduler.run(sources.engine, lambda row: seen.append(row.id), max_sources=100, concurrency=3)
    assert (stats.claimed, stats.succeeded) == (6, 6)
    assert sorted(seen) == list(range(1, 11))


def test_run_with_concurrency_runs_handlers_side_by_side(sources: Sources) -> None:
    sources.add(*[{"id": n} for n in range(1, 9)])
    scheduler = sources.scheduler(interval=HOUR)
    lock = threading.Lock()
    in_flight, most = 0, 0

    def handler(row: Any) -> None:
        nonlocal in_flight, most
        with lock:
            in_flight += 1
            most = max(most, in_flight)
        time.sleep(0.05)
        with lock:
            in_flight -= 1
        if row.id % 4 == 0:
            raise KeyError(row.id)

    stats = scheduler.run(sources.engine, handler, max_sources=100, concurrency=4)
    assert (stats.claimed, stats.succeeded, stats.failed) == (8, 6, 2)
    assert stats.errors == {4: "KeyError: 4", 8: "KeyError: 8"}
    assert 1 < most <= 4


def test_arun_with_an_async_handler_runs_them_concurrently_and_isolates_errors(sources: Sources) -> None:
    sources.add(*[{"id": n} for n in range(1, 31)])
    scheduler = sources.scheduler(interval=HOUR)
    in_flight, most = 0, 0
    seen: list[int] = []

    async def handler(row: Any) -> None:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        try:
            await asyncio.sleep(0.03)
            if row.id in (7, 13):
                raise TimeoutError(f"source {row.id} timed out")
            seen.append(row.id)
        finally:
            in_flight -= 1

    stats = asyncio.run(scheduler.arun(sources.engine, handler, max_sources=100, concurrency=10))
    assert (stats.claimed, stats.succeeded, stats.failed, stats.lost) == (30, 28, 2, 0)
    assert stats.errors == {7: "TimeoutError: source 7 timed out", 13: "TimeoutError: source 13 timed out"}
    assert sorted(seen) == sorted(set(range(1, 31)) - {7, 13})
    assert 1 < most <= 10
    rows = sources.rows()
    assert all(row.last_run_at is not None and row.lease_status == "idle" for row in rows.values())
    assert {n for n, row in rows.items() if row.last_error is not None} == {7, 13}
    assert rows[7].last_error.startswith("TimeoutError: source 7 timed out")
    assert scheduler.due_rows(sources.engine) == []


def test_arun_with_a_sync_handler_and_max_sources(sources: Sources) -> None:
    sources.add(*[{"id": n} for n in range(1, 9)])
    scheduler = sources.scheduler(interval=HOUR)
    seen: list[int] = []

    def handler(row: Any) -> None:
        time.sleep(0.01)
        if row.id == 2:
            raise ValueError("bad feed")
        seen.append(row.id)

    stats = asyncio.run(scheduler.arun(sources.engine, handler, max_sources=5, concurrency=3))
    assert stats.claimed == 5
    assert stats.succeeded + stats.failed == 5
    stats_rest = asyncio.run(scheduler.arun(sources.engine, handler, max_sources=100, concurrency=3))
    assert stats_rest.claimed == 3
    assert stats.failed + stats_rest.failed == 1
    assert {**stats.errors, **stats_rest.errors} == {2: "ValueError: bad feed"}
    assert sorted(seen) == [1, 3, 4, 5, 6, 7, 8]


@pytest.mark.parametrize("due_url", ["sqlite"], indirect=True)  # run()'s renewal is tested on every backend
def test_arun_renews_the_lease_of_a_long_async_handler(sources: Sources) -> None:
    sources.add({"id": 1})
    scheduler = sources.scheduler(interval=HOUR, lease=0.6)
    thief = sources.scheduler(interval=HOUR, lease=30)
    stolen: list[dibs.Lease] = []

    async def handler(row: Any) -> None:
        for _ in range(10):  # a second, past the lease
            await asyncio.sleep(0.1)
            stolen.extend(await asyncio.to_thread(thief.claim, sources.engine, owner="thief", limit=1))

    stats = asyncio.run(scheduler.arun(sources.engine, handler))
    assert stolen == []
    assert (stats.claimed, stats.succeeded, stats.lost) == (1, 1, 0)


class Fetcher:
    """A handler with state whose __call__ is async."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    async def __call__(self, row: Any) -> None:
        await asyncio.sleep(0.01)
        self.seen.append(row.id)


def dropping_unawaited(work: Any) -> Any:
    """``work()``, with the warning of a coroutine dropped unawaited kept from failing the test at teardown:
    the assertions that follow say what went wrong."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = work()
        gc.collect()
    return result


@pytest.mark.parametrize("due_url", ["sqlite"], indirect=True)  # the same on every backend
def test_arun_awaits_an_async_callable_object(sources: Sources) -> None:
    """A handler whose __call__ is async must be awaited, not called in a thread whose coroutine is
    dropped unrun while its source is marked done."""
    sources.add({"id": 1}, {"id": 2})
    scheduler = sources.scheduler(interval=HOUR)
    fetcher = Fetcher()
    stats = dropping_unawaited(lambda: asyncio.run(scheduler.arun(sources.engine, fetcher)))
    assert sorted(fetcher.seen) == [1, 2], f"the handler never ran, yet {stats}"
    assert (stats.claimed, stats.succeeded) == (2, 2)


@pytest.mark.parametrize("due_url", ["sqlite"], indirect=True)  # the same on every backend
def test_run_refuses_an_async_callable_object(sources: Sources) -> None:
    """run() refuses an async function; an object whose __call__ is async is just as async: refused too,
    rather than called, its coroutine dropped, and the source marked done."""
    sources.add({"id": 1})
    scheduler = sources.scheduler(interval=HOUR)
    fetcher = Fetcher()
    try:
        stats = dropping_unawaited(lambda: scheduler.run(sources.engine, fetcher))
    except dibs.InvalidArgument:
        stats = None
    assert stats is None, f"run() took the async handler and reported {stats}; ran: {fetcher.seen}"
    assert sources.row(1).last_run_at is None
