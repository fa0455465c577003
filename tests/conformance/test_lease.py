"""Fenced leases (DESIGN section 2), on every backend x driver x strategy."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa

import dibs
from dibs.lease import writes
from tests.conformance.tables import fill, leased_columns, make_leased
from tests.helpers.harness import Harness


def database_now(db: Harness) -> datetime:
    """The database's clock (the application's, on SQLite, which runs in-process)."""
    if db.family == "sqlite":
        return datetime.now(timezone.utc)
    query = "SELECT now()" if db.family == "postgresql" else "SELECT UTC_TIMESTAMP(6)"
    moment = db.scalar(sa.text(query))
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def test_claim_sets_owner_token_attempts_and_an_expiry_on_the_database_clock(db: Harness) -> None:
    _, leases = make_leased(db, 3)
    before = database_now(db)
    held = db.lease(leases, "claim", owner="worker-1", duration=timedelta(seconds=30), limit=2, order_by="id")
    after = database_now(db)
    assert [lease.key for lease in held] == [(1,), (2,)]
    for lease in held:
        assert (lease.owner, lease.token) == ("worker-1", 1)
        assert (lease.row.status, lease.row.lease_owner, lease.row.attempts) == ("running", "worker-1", 1)
        assert before + timedelta(seconds=29) <= lease.expires_at <= after + timedelta(seconds=31)
    # Nothing else is eligible while the leases are live and the third row is the only ready one.
    more = db.lease(leases, "claim", owner="worker-2", duration=30, limit=5)
    assert [lease.key for lease in more] == [(3,)]
    assert db.lease(leases, "claim", owner="worker-2", duration=30, limit=5) == []


def test_an_expired_lease_is_claimed_again_with_a_new_token(db: Harness) -> None:
    _, leases = make_leased(db, 1)
    (first,) = db.lease(leases, "claim", owner="worker-1", duration=0.3)
    assert db.lease(leases, "claim", owner="worker-2", duration=30) == []
    time.sleep(0.5)
    (second,) = db.lease(leases, "claim", owner="worker-2", duration=30)
    assert second.key == first.key
    assert second.token == first.token + 1
    assert (second.row.lease_owner, second.row.attempts) == ("worker-2", 2)


def test_a_stale_holder_changes_nothing_and_learns_it_lost_the_lease(db: Harness) -> None:
    table, leases = make_leased(db, 1)
    (stale,) = db.lease(leases, "claim", owner="worker-1", duration=30)
    db.execute(sa.update(table).values(lease_expires_at=datetime(2000, 1, 1)))  # the lease runs out
    (current,) = db.lease(leases, "claim", owner="worker-2", duration=30)

    for action, extra in (("complete", {}), ("fail", {}), ("release", {}), ("renew", {"duration": 60})):
        args = (stale, extra["duration"]) if extra else (stale,)
        with pytest.raises(dibs.LeaseLost, match="no longer held") as lost:
            db.lease(leases, action, *args)
        assert lost.value.leases == (stale,)
    row = db.rows(sa.select(table))[0]
    assert (row.status, row.lease_owner, row.lease_token) == ("running", "worker-2", current.token)
    # The current holder still can.
    db.lease(leases, "complete", current, set={"payload": "finished by worker-2"})
    row = db.rows(sa.select(table))[0]
    assert (row.status, row.payload) == ("done", "finished by worker-2")


def test_renew_extends_the_lease_on_the_database_clock(db: Harness) -> None:
    table, leases = make_leased(db, 1)
    (lease,) = db.lease(leases, "claim", owner="worker-1", duration=0.3)
    db.lease(leases, "renew", lease, timedelta(minutes=10))
    expires = db.scalar(sa.select(table.c.lease_expires_at))
    expires = expires if expires.tzinfo else expires.replace(tzinfo=timezone.utc)
    assert expires >= database_now(db) + timedelta(minutes=9)
    time.sleep(0.5)  # past the first expiry: the renewed lease still holds
    assert db.lease(leases, "claim", owner="worker-2", duration=30) == []
    db.lease(leases, "complete", lease)


def test_complete_and_fail_many_in_one_statement_report_the_lost(db: Harness) -> None:
    table, leases = make_leased(db, 6)
    held = db.lease(leases, "claim", owner="worker-1", duration=30, limit=6, order_by="id")
    db.execute(sa.update(table).where(table.c.id == 2).values(lease_expires_at=datetime(2000, 1, 1)))
    (taken_over,) = db.lease(leases, "claim", owner="worker-2", duration=30)
    assert taken_over.key == (2,)

    lost = db.lease(leases, "complete_many", held[:3], set={"payload": "ok"})
    assert lost == [held[1]]
    lost = db.lease(leases, "fail_many", held[3:], set={"payload": "boom"})
    assert lost == []
    states = {row.id: (row.status, row.payload) for row in db.rows(sa.select(table))}
    assert states == {
        1: ("done", "ok"),
        2: ("running", "p2"),
        3: ("done", "ok"),
        4: ("failed", "boom"),
        5: ("failed", "boom"),
        6: ("failed", "boom"),
    }
    assert db.lease(leases, "complete_many", []) == []


def refuse_done(db: Harness, table: sa.Table, key: int) -> None:
    """A trigger that refuses to mark row ``key`` done: a statement that tries fails as a whole."""
    name = f"{table.name}_refuse"
    when = f"NEW.id = {key} AND NEW.status = 'done'"
    with db.admin.begin() as conn:
        if db.family == "sqlite":
            conn.exec_driver_sql(
                f"CREATE TRIGGER {name} BEFORE UPDATE ON {table.name} WHEN {when} "
                "BEGIN SELECT RAISE(ABORT, 'refused'); END"
            )
        elif db.family == "postgresql":
            conn.exec_driver_sql(
                f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS "
                f"$$ BEGIN IF {when} THEN RAISE EXCEPTION 'refused'; END IF; RETURN NEW; END $$"
            )
            conn.exec_driver_sql(
                f"CREATE TRIGGER {name} BEFORE UPDATE ON {table.name} FOR EACH ROW EXECUTE FUNCTION {name}()"
            )
        else:
            conn.exec_driver_sql(
                f"CREATE TRIGGER {name} BEFORE UPDATE ON {table.name} FOR EACH ROW BEGIN IF {when} THEN "
                "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused'; END IF; END"
            )


def test_a_write_of_more_leases_than_one_statement_takes_is_all_or_nothing(
    db: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writes, "WRITE_CHUNK", 4)  # 10 leases: three statements
    table, leases = make_leased(db, 10)
    held = db.lease(leases, "claim", owner="worker-1", duration=300, limit=10, order_by="id")
    refuse_done(db, table, 9)
    with pytest.raises(sa.exc.DBAPIError, match="refused"):
        db.lease(leases, "complete_many", held)
    assert {row.status for row in db.rows(sa.select(table))} == {"running"}
    assert db.lease(leases, "complete_many", held[:8]) == []
    assert [row.status for row in db.rows(sa.select(table).order_by(table.c.id))] == ["done"] * 8 + ["running"] * 2


def test_release_makes_the_row_ready_at_once_and_uncounts_the_attempt(db: Harness) -> None:
    table, leases = make_leased(db, 3)
    held = db.lease(leases, "claim", owner="worker-1", duration=300, limit=3, order_by="id")
    db.lease(leases, "release", held[0])
    assert db.lease(leases, "release_many", held[1:]) == []
    rows = db.rows(sa.select(table).order_by(table.c.id))
    assert [(row.status, row.attempts, row.lease_expires_at) for row in rows] == [("ready", 0, None)] * 3
    again = db.lease(leases, "claim", owner="worker-2", duration=30, limit=3, order_by="id")
    assert [lease.token for lease in again] == [2, 2, 2]
    with pytest.raises(dibs.LeaseLost):
        db.lease(leases, "complete", held[0])


def test_renew_many_reports_the_lost(db: Harness) -> None:
    _, leases = make_leased(db, 2)
    held = db.lease(leases, "claim", owner="worker-1", duration=30, limit=2, order_by="id")
    db.lease(leases, "complete", held[0])
    assert db.lease(leases, "renew_many", held, 60) == [held[0]]


def test_lease_claim_takes_criteria_order_and_extra_values(db: Harness) -> None:
    table, leases = make_leased(db, 5)
    held = db.lease(
        leases,
        "claim",
        owner="worker-1",
        duration=30,
        where=table.c.id > 2,
        order_by=table.c.id.desc(),
        limit=2,
        set={"payload": "picked"},
    )
    assert [(lease.key, lease.row.payload) for lease in held] == [((5,), "picked"), ((4,), "picked")]


def test_a_batch_holding_a_stale_and_the_current_lease_of_one_row_reports_the_stale_one(db: Harness) -> None:
    table, leases = make_leased(db, 1)
    (stale,) = db.lease(leases, "claim", owner="worker-1", duration=30)
    db.execute(sa.update(table).values(lease_expires_at=datetime(2000, 1, 1)))
    (current,) = db.lease(leases, "claim", owner="worker-1", duration=30)
    assert db.lease(leases, "complete_many", [stale, current]) == [stale]
    assert db.rows(sa.select(table.c.status))[0].status == "done"


def test_a_takeover_is_detected_inside_the_callers_own_transaction(db: Harness) -> None:
    if not db.target.concurrent_writers:
        pytest.skip("needs a second writer while the caller's transaction is open")
    if db.target.is_async:
        pytest.skip("drives the caller's transaction from a synchronous connection (asyncio runs the same code)")
    table, leases = make_leased(db, 1)
    (stale,) = db.lease(leases, "claim", owner="worker-1", duration=30)
    with db.engine.connect() as conn, conn.begin():
        conn.execute(sa.select(table)).all()  # the caller's snapshot now shows its own lease
        with db.admin.begin() as other:
            other.execute(sa.update(table).values(lease_expires_at=datetime(2000, 1, 1)))
        (current,) = leases.claim(db.admin, owner="worker-2", duration=30)
        with pytest.raises(dibs.LeaseLost):
            leases.renew(conn, stale, 60)
    row = db.rows(sa.select(table))[0]
    assert (row.lease_owner, row.lease_token) == ("worker-2", current.token)


@pytest.mark.parametrize(
    ("key_type", "keys"),
    [
        (sa.Uuid(as_uuid=False), [str(uuid.UUID(int=n)) for n in (1, 2, 3)]),
        (sa.String(40), ["plain", "quote ' and \" and \\\\", "unicode ü 😀", "nul \x00 inside"]),
    ],
    ids=["uuid-as-text", "text"],
)
def test_keys_of_other_types_are_claimed_and_fenced_exactly(db: Harness, key_type: Any, keys: list[str]) -> None:
    if "\x00" in "".join(keys) and db.family == "postgresql":
        keys = [key for key in keys if "\x00" not in key]  # PostgreSQL text cannot hold NUL at all
    table = db.table("typed", sa.Column("id", key_type, primary_key=True), *dibs.lease_columns())
    db.execute(table.insert(), [{"id": key} for key in keys])
    leases = db.leases(table)
    held = db.lease(leases, "claim", owner="worker-1", duration=30, limit=10, order_by="id")
    assert sorted(lease.key[0] for lease in held) == sorted(keys)
    db.execute(sa.update(table).where(table.c.id == keys[0]).values(lease_expires_at=datetime(2000, 1, 1)))
    (current,) = db.lease(leases, "claim", owner="worker-2", duration=30)
    lost = db.lease(leases, "complete_many", [*held, current])
    assert [lease.key[0] for lease in lost] == [keys[0]]  # only the lease that was taken over
    assert {row.status for row in db.rows(sa.select(table))} == {"done"}


def test_without_reclaiming_expired_leases_recover_puts_them_back(db: Harness) -> None:
    table = db.table("recovered", *leased_columns(), sa.Column("finished_at", dibs.Timestamp, nullable=True))
    db.execute(table.insert(), fill(table, 3))
    leases = db.leases(table, reclaim_expired=False, finished_at="finished_at")
    held = db.lease(leases, "claim", owner="crashed", duration=0.3, limit=3, order_by="id")
    assert len(held) == 3
    time.sleep(0.5)
    # Expired, but this claim reads ready rows only.
    assert db.lease(leases, "claim", owner="other", duration=30, limit=3) == []
    # The row on its last attempt gives up; the others are ready again.
    buried = db.lease(leases, "recover", where=table.c.id == 3, status="failed", set={"payload": "gave up"})
    assert buried == [(3,)]
    assert sorted(db.lease(leases, "recover")) == [(1,), (2,)]
    assert db.lease(leases, "recover") == []
    rows = {row.id: row for row in db.rows(sa.select(table))}
    assert (rows[3].status, rows[3].payload, rows[3].lease_owner) == ("failed", "gave up", None)
    assert rows[3].finished_at is not None
    assert (rows[1].status, rows[1].lease_owner, rows[1].finished_at) == ("ready", None, None)
    # The crashed holder's late write changes nothing; the new holder's does.
    lost = db.lease(leases, "complete_many", held)
    assert len(lost) == 3
    again = db.lease(leases, "claim", owner="other", duration=30, limit=3, order_by="id")
    assert [lease.key for lease in again] == [(1,), (2,)]
    assert db.lease(leases, "complete_many", again) == []
    finished = db.rows(sa.select(table.c.finished_at).where(table.c.status == "done"))
    assert len(finished) == 2
    assert all(row.finished_at is not None for row in finished)


def test_recover_in_batches_takes_every_expired_lease_longest_expired_first(db: Harness) -> None:
    table, leases = make_leased(db, 5)
    first = db.lease(leases, "claim", owner="crashed", duration=0.3, limit=2, where=table.c.id.in_([4, 5]))
    assert len(first) == 2
    time.sleep(0.2)
    later = db.lease(leases, "claim", owner="crashed", duration=0.3, limit=3, order_by="id")
    assert [lease.key for lease in later] == [(1,), (2,), (3,)]
    time.sleep(0.6)
    recovered = db.lease(leases, "recover", batch=2)
    # Three statements (2, 2, 1 rows), the two that expired first in the first.
    assert sorted(recovered[:2]) == [(4,), (5,)]
    assert sorted(recovered) == [(1,), (2,), (3,), (4,), (5,)]
    assert db.lease(leases, "recover", batch=2) == []
    assert {row.status for row in db.rows(sa.select(table))} == {"ready"}
    for bad in (0, -1, True, 1.5):
        with pytest.raises(dibs.InvalidArgument, match="batch must be a"):
            db.lease(leases, "recover", batch=bad)
    # recover sets the status and clears the expiry itself: a set= naming them is refused, nothing written.
    for column in ("status", "lease_expires_at"):
        with pytest.raises(dibs.InvalidArgument, match=f"set must not name {column}"):
            db.lease(leases, "recover", set={column: None})


def test_a_claimer_fixes_criteria_and_takes_parameters_per_call(db: Harness) -> None:
    table = db.table("claimer", *leased_columns())
    db.execute(table.insert(), fill(table, 6, payload=lambda i: "a" if i % 2 else "b"))
    leases = db.leases(table)
    claimer = leases.claimer(
        where=table.c.payload.in_(sa.bindparam("kinds", expanding=True)),
        order_by=[table.c.id.desc()],
        set={table.c.attempts: table.c.attempts + sa.bindparam("step", type_=sa.Integer)},
    )

    def claim(kinds: list[str], limit: int) -> list[dibs.Lease]:
        options = {"owner": "w", "duration": 30, "limit": limit, "parameters": {"kinds": kinds, "step": 10}}
        if db.target.is_async:
            return db.run(claimer.aclaim(db.engine, **options))
        return claimer.claim(db.engine, **options)

    assert [lease.key for lease in claim(["b"], 2)] == [(6,), (4,)]
    assert [lease.key for lease in claim(["a"], 5)] == [(5,), (3,), (1,)]
    assert [lease.key for lease in claim(["a", "b"], 5)] == [(2,)]
    # The claimer's own value for a column replaces the lease's (attempts + 1).
    assert {row.attempts for row in db.rows(sa.select(table))} == {10}


def test_finish_values_may_take_parameters(db: Harness) -> None:
    _, leases = make_leased(db, 2)
    table = leases.table
    held = db.lease(leases, "claim", owner="w", duration=30, limit=2, order_by="id")
    lost = db.lease(
        leases,
        "fail_many",
        held,
        status="ready",
        set={"payload": sa.bindparam("prefix", type_=sa.String) + "-x"},
        parameters={"prefix": "retry"},
    )
    assert lost == []
    assert {(row.status, row.payload) for row in db.rows(sa.select(table))} == {("ready", "retry-x")}


def test_a_claimer_returns_only_the_columns_asked_for_and_what_a_lease_needs(db: Harness) -> None:
    _, leases = make_leased(db, 3)
    table = leases.table
    claimer = leases.claimer(order_by=[table.c.id], columns=["payload", table.c.attempts])
    options = {"owner": "w", "duration": 30, "limit": 2}
    held = db.run(claimer.aclaim(db.engine, **options)) if db.target.is_async else claimer.claim(db.engine, **options)
    assert [lease.key for lease in held] == [(1,), (2,)]
    for lease in held:
        assert list(lease.row._mapping) == ["id", "lease_token", "lease_expires_at", "payload", "attempts"]
        assert (lease.token, lease.row.payload, lease.row.attempts) == (1, f"p{lease.key[0]}", 1)
    assert db.lease(leases, "complete_many", held) == []
    assert [row.status for row in db.rows(sa.select(table).order_by(table.c.id))] == ["done", "done", "ready"]
