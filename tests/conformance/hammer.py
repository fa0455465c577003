"""One contending worker process: claims small random batches from a shared table until it is empty.

Run by test_contention in many OS processes at once. Each call stamps the rows it claims with its own
call id, so that the parent can count, from the database, how many rows every single call took.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import sqlalchemy as sa

import dibs
from tests.conformance.tables import work_columns

Call = tuple[str, int, list[int]]  # call id, the limit asked for, the ids returned


def work_table(name: str) -> sa.Table:
    return sa.Table(name, sa.MetaData(), *work_columns())


def hammer(url: str, is_async: bool, strategy: str | None, table_name: str, worker: int) -> list[Call]:
    """Claim until three claims in a row come back empty; return every call made.

    The strategy ``"naive"`` is the broken read-then-update the suite exists to rule out; it is here
    only so that a test can show the checks catch it.
    """
    table = work_table(table_name)
    if is_async:
        return asyncio.run(_hammer_async(url, strategy, table, worker))
    engine = dibs.create_engine(url)
    claim = _naive_claim if strategy == "naive" else dibs.claim
    try:
        calls: list[Call] = []
        for call_id, limit in _calls(worker, calls):
            rows = claim(engine, table, strategy=strategy, **_arguments(table, call_id, limit))
            calls.append((call_id, limit, [row.id for row in rows]))
        return calls
    finally:
        engine.dispose()


def _naive_claim(engine: sa.Engine, table: sa.Table, **options: Any) -> list[sa.Row[Any]]:
    """SELECT, then UPDATE in another transaction, with no lock and no guard: two workers take one row."""
    with engine.connect() as conn:
        query = sa.select(table.c.id).where(options["where"]).order_by(*options["order_by"]).limit(options["limit"])
        ids = list(conn.scalars(query))
        conn.commit()
        if not ids:
            return []
        for row_id in ids:
            conn.execute(sa.update(table).where(table.c.id == row_id).values(options["set"]))
            conn.commit()
        return list(conn.execute(sa.select(table).where(table.c.id.in_(ids))))


async def _hammer_async(url: str, strategy: str | None, table: sa.Table, worker: int) -> list[Call]:
    engine = dibs.create_async_engine(url)
    try:
        calls: list[Call] = []
        for call_id, limit in _calls(worker, calls):
            rows = await dibs.aclaim(engine, table, strategy=strategy, **_arguments(table, call_id, limit))
            calls.append((call_id, limit, [row.id for row in rows]))
        return calls
    finally:
        await engine.dispose()


def _calls(worker: int, made: list[Call]) -> Any:
    """Call ids and random small limits, until the last three calls made came back empty."""
    rng = random.Random(worker)
    while len(made) < 3 or any(ids for _, _, ids in made[-3:]):
        yield f"w{worker}c{len(made)}", rng.randint(1, 7)


def _arguments(table: sa.Table, call_id: str, limit: int) -> dict[str, Any]:
    return {
        "where": table.c.status == "ready",
        "set": {"status": "claimed", "claimed_by": call_id, "attempts": table.c.attempts + 1},
        "limit": limit,
        "order_by": [table.c.priority, table.c.id],
    }
