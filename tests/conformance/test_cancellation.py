"""A claim cancelled mid-transaction: the caller sees its own cancellation, and nothing is claimed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import sqlalchemy as sa

import dibs
from tests.conformance.tables import fill, work_columns
from tests.helpers.harness import Harness

SLEEP = {"postgresql": "SELECT pg_sleep(2)", "mariadb": "SELECT SLEEP(2)"}


def test_a_cancelled_claim_raises_the_cancellation_and_claims_nothing(db: Harness) -> None:
    if not db.target.is_async or db.family not in SLEEP:
        pytest.skip("needs an asyncio driver and a server-side sleep to cancel")
    work = db.table("cancelled", *work_columns())
    db.execute(work.insert(), fill(work, 3))

    def slow(conn: sa.Connection, rows: list[sa.Row[Any]]) -> None:
        conn.exec_driver_sql(SLEEP[db.family])

    async def cancelled() -> None:
        engine = dibs.create_async_engine(db.url, isolation_level="AUTOCOMMIT")
        try:
            claim = dibs.aclaim(
                engine,
                work,
                where=work.c.status == "ready",
                set={"status": "running"},
                limit=3,
                then=slow,
                strategy=db.target.strategy,
            )
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(claim, timeout=0.3)
        finally:
            await engine.dispose()

    db.run(cancelled())
    assert db.scalar(sa.select(sa.func.count()).where(work.c.status == "ready")) == 3
