"""Many OS processes hammering one table: every row claimed exactly once, none lost, no call over its limit."""

from __future__ import annotations

import multiprocessing
from collections import Counter
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conformance.hammer import Call, hammer
from tests.conformance.tables import fill, work_columns
from tests.helpers.harness import Harness
from tests.helpers.targets import Target

PROCESSES = 8
ROWS = 3000


def contend(db: Harness, strategy: str | None) -> list[str]:
    """Run PROCESSES hammering processes on a fresh table; return every broken promise found."""
    work = db.table(f"contended_{strategy or 'native'}", *work_columns())
    # Few distinct priorities, so that many claimers chase the same index range.
    db.execute(work.insert(), fill(work, ROWS, priority=lambda i: i % 5))
    url = db.url.render_as_string(hide_password=False)
    arguments = [(url, db.target.is_async, strategy, work.name, worker) for worker in range(PROCESSES)]
    with multiprocessing.get_context("spawn").Pool(PROCESSES) as pool:
        results = pool.starmap(hammer, arguments, chunksize=1)
    assert sum(1 for worker_calls in results if any(ids for _, _, ids in worker_calls)) > 1, "no contention"
    calls = [call for worker_calls in results for call in worker_calls]
    stored = db.rows(sa.select(work.c.id, work.c.status, work.c.attempts, work.c.claimed_by))
    return broken_promises(calls, stored)


def broken_promises(calls: list[Call], stored: list[sa.Row[Any]]) -> list[str]:
    """What the calls' own reports and the table's final state say went wrong."""
    broken = []
    over_limit = [call_id for call_id, limit, ids in calls if len(ids) > limit]
    if over_limit:
        broken.append(f"{len(over_limit)} calls returned more rows than their limit")
    returned = Counter(row_id for _, _, ids in calls for row_id in ids)
    twice = [row_id for row_id, times in returned.items() if times > 1]
    if twice:
        broken.append(f"{len(twice)} rows were returned to two callers")
    if sorted(returned) != list(range(1, ROWS + 1)):
        broken.append(f"{ROWS - len(returned)} rows were never claimed")
    # The database must agree: each row updated once, by the call that says it got it, and no call
    # changed more rows than it returned.
    if {(row.status, row.attempts) for row in stored} != {("claimed", 1)}:
        broken.append("some rows were claimed more than once, or never")
    owner = {row_id: call_id for call_id, _, ids in calls for row_id in ids}
    if {row.id: row.claimed_by for row in stored} != owner:
        broken.append("the table disagrees with the callers about who claimed what")
    returned_per_call = {call_id: len(ids) for call_id, _, ids in calls}
    changed_per_call = Counter(row.claimed_by for row in stored)
    if any(changed != returned_per_call[call_id] for call_id, changed in changed_per_call.items()):
        broken.append("a call changed a different number of rows than it returned")
    return broken


@pytest.mark.contention
def test_many_processes_claim_every_row_exactly_once(db: Harness) -> None:
    if not db.target.shared_across_processes:
        pytest.skip("an in-memory SQLite database lives in one process")
    assert contend(db, db.target.strategy) == []


@pytest.mark.contention
@pytest.mark.parametrize("db", [Target("postgresql", "postgresql+psycopg", False)], indirect=True, ids=["postgresql"])
def test_the_checks_catch_a_naive_read_then_update(db: Harness) -> None:
    """The same checks flag the race dibs exists to prevent, so their passing above means something."""
    assert "rows were returned to two callers" in " ".join(contend(db, "naive"))
