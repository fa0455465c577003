"""The lease keeper on every database: held leases outlive their first expiry, a lease taken over is reported
lost once and no longer renewed, and a dropped lease is left to expire."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

import dibs
from dibs.lease import Lease
from dibs.runtime import DatabaseThreads, LeaseKeeper
from dibs.runtime.lease_keeper import Renew
from tests.conformance.tables import fill, leased_columns
from tests.helpers import BACKENDS, wait_until
from tests.helpers.targets import SYNC_DRIVERS, database_url

_tables = itertools.count()


class Leased:
    """A table of three rows with lease columns, on one database."""

    def __init__(self, url: sa.URL) -> None:
        self.engine = dibs.create_engine(url)
        self.metadata = sa.MetaData()
        self.table = sa.Table(f"keeper_{next(_tables)}", self.metadata, *leased_columns())
        self.table.create(self.engine)
        with self.engine.begin() as conn:
            conn.execute(self.table.insert(), fill(self.table, 3))
        self.leases = dibs.Leases(self.table)

    def claim(self, owner: str, seconds: float, limit: int = 3) -> list[Lease]:
        return self.leases.claim(self.engine, owner=owner, duration=seconds, limit=limit, order_by="id")

    def renew(self, seconds: float) -> Renew:
        return lambda held: self.leases.renew_many(self.engine, held, seconds)

    def expire(self, lease: Lease) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                sa.update(self.table)
                .where(self.table.c.id == lease.key[0])
                .values(lease_expires_at=datetime(2000, 1, 1))
            )

    def close(self) -> None:
        self.metadata.drop_all(self.engine)
        self.engine.dispose()


@pytest.fixture(params=BACKENDS)
def leased(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Leased]:
    family: str = request.param
    table = Leased(database_url(request, family, SYNC_DRIVERS[family], tmp_path / "keeper.sqlite"))
    try:
        yield table
    finally:
        table.close()


def test_held_leases_are_renewed_past_their_first_expiry(leased: Leased) -> None:
    held = leased.claim("keeper", 0.6)
    lost: list[Lease] = []
    keeper = LeaseKeeper(leased.renew(0.6), every=0.15, lost=lost.append)
    keeper.hold(held)

    async def keep() -> None:
        threads = DatabaseThreads(1, name="test-keeper")
        beats = asyncio.create_task(keeper.run(threads))
        await asyncio.sleep(1.5)
        beats.cancel()
        threads.shutdown()

    asyncio.run(keep())
    assert lost == []
    assert leased.claim("thief", 30) == []  # still held: nothing expired


def test_a_lease_taken_over_is_reported_lost_once_and_no_longer_renewed(leased: Leased) -> None:
    first, second, _ = leased.claim("keeper", 30)
    leased.expire(first)
    (taken,) = leased.claim("thief", 30, limit=1)
    assert taken.key == first.key
    lost: list[Lease] = []
    keeper = LeaseKeeper(leased.renew(30), every=10.0, lost=lost.append)
    keeper.hold([first, second])

    async def two_beats() -> None:
        threads = DatabaseThreads(1, name="test-keeper")
        await keeper.beat(threads)
        await keeper.beat(threads)
        threads.shutdown()

    asyncio.run(two_beats())
    assert lost == [first]
    assert not keeper.holds(first)
    assert keeper.holds(second)


def test_a_dropped_lease_is_left_to_expire(leased: Leased) -> None:
    first, second, third = leased.claim("keeper", 0.6)
    keeper = LeaseKeeper(leased.renew(0.6), every=0.15, lost=lambda lease: None)
    keeper.hold([first, second, third])
    keeper.drop(second)
    with keeper.in_thread():
        taken = wait_until(lambda: leased.claim("thief", 30), timeout=5.0, what="the dropped lease to expire")
    assert [lease.key for lease in taken] == [second.key]


def test_a_lease_finished_while_its_renewal_ran_is_not_reported_lost(leased: Leased) -> None:
    (lease,) = leased.claim("keeper", 30, limit=1)
    leased.leases.complete(leased.engine, lease)
    lost: list[Lease] = []
    keeper = LeaseKeeper(leased.renew(30), every=10.0, lost=lost.append)
    keeper.hold([lease])
    renew = keeper._renew

    def renew_then_finish(held: list[Lease]) -> list[Lease]:
        refused = list(renew(held))
        keeper.drop(lease)  # as a runner would, while the renewal was on its way
        return refused

    keeper._renew = renew_then_finish

    async def beat() -> None:
        threads = DatabaseThreads(1, name="test-keeper")
        await keeper.beat(threads)
        threads.shutdown()

    asyncio.run(beat())
    assert lost == []


def test_a_row_claimed_again_replaces_its_older_lease_which_is_reported_lost(leased: Leased) -> None:
    (older,) = leased.claim("keeper", 30, limit=1)
    leased.expire(older)
    (newer,) = leased.claim("keeper", 30, limit=1)  # the same row, once its lease expired
    assert (newer.key, newer.token) == (older.key, older.token + 1)
    lost: list[Lease] = []
    keeper = LeaseKeeper(leased.renew(30), every=10.0, lost=lost.append)
    keeper.hold([older])
    keeper.hold([newer])
    assert lost == [older]
    keeper.drop(older)  # the older run ends: the newer lease stays held
    assert keeper.holds(newer)


@pytest.mark.parametrize("order", ["older first", "newer first"])
def test_leases_kept_after_a_failed_write_leave_the_newest_of_each_row_held(leased: Leased, order: str) -> None:
    (older,) = leased.claim("keeper", 30, limit=1)
    leased.expire(older)
    (newer,) = leased.claim("keeper", 30, limit=1)
    keeper = LeaseKeeper(leased.renew(30), every=10.0, lost=lambda lease: None)
    keeper.hold([newer])
    # One batch of outcomes held both; its write failed, so both are kept for the next try.
    keeper.drop(older)
    keeper.drop(newer)
    keeper.keep([older, newer] if order == "older first" else [newer, older])
    assert keeper.holds(newer)
    keeper.keep([older])  # nor does a later try put the older back over it
    assert keeper.holds(newer)
