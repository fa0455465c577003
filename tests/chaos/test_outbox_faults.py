"""Outbox relays under faults, checked from the broker's side (Redis Streams).

* Relays killed between publish and mark, among other relays, on every backend: every committed event
  reaches the broker, nothing rolled back does, the only duplicates are the killed relays' unmarked batches
  (each exactly once more, after their lease expired), and each aggregate's events arrive in creation order.
* The database restarted under relay processes (throwaway PostgreSQL and MariaDB servers): every event
  reaches the broker, and each aggregate's events arrive in creation order, a re-delivery (a mark lost with
  the connection) coming straight after its first delivery.
"""

from __future__ import annotations

import itertools
import json
import re
import signal
from collections import Counter, defaultdict
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

import dibs
from dibs.schema import PUBLISHED
from dibs.schema import outbox as outbox_table
from tests.chaos.infra_support import start_throwaway
from tests.helpers import wait_until
from tests.outbox.support import (
    OutboxDatabase,
    RelayProcess,
    add_events,
    aware,
    entry_millis,
    ids_per_aggregate,
    interleaved,
    read_stream,
    redis_publisher_url,
)

#: The relays killed, each frozen after confirming its K-th batch (before marking it).
KILLED = {"killed-a": 2, "killed-b": 4}


@pytest.fixture
def relays() -> Iterator[list[RelayProcess]]:
    """Relay processes the test started; any still running at the end is killed."""
    started: list[RelayProcess] = []
    yield started
    for process in started:
        process.close()


def add_then_roll_back(outbox: dibs.Outbox, aggregate_id: str) -> None:
    """Add an event in a business transaction that then fails: the event must never reach a broker."""
    with outbox.engine.begin() as conn:
        outbox.add(conn, "order", aggregate_id, "order.ghost", {"ghost": True})
        raise RuntimeError("rolled back")


def first_deliveries_in_order(seen: list[int]) -> list[int]:
    """An aggregate's ids as the broker holds them, each re-delivery right after its first one removed:
    a frozen event holds its aggregate's later events back until it is published again, so its second copy
    must come straight after the first."""
    return [event_id for event_id, _ in itertools.groupby(seen)]


def test_relays_killed_between_publish_and_mark_lose_nothing_and_duplicate_only_their_batch(
    odb: OutboxDatabase,
    redis_url: str,
    redis_prefix: str,
    relays: list[RelayProcess],
    tmp_path: Path,
) -> None:
    outbox = odb.outbox()
    url = redis_publisher_url(redis_url, redis_prefix)
    ids = add_events(outbox, interleaved(aggregates=80, per_aggregate=5), per_transaction=80)

    # Two steady relays, slowed so that the work lasts; two that freeze after their 2nd and 4th batch.
    for n in range(2):
        relays.append(
            RelayProcess(
                tmp_path,
                f"steady-{n}",
                odb.url,
                url,
                "--batch",
                "8",
                "--concurrency",
                "2",
                "--lease",
                "2.5",
                "--slow",
                "0.05",
                "--jitter",
                "0.05",
            )
        )
    frozen_files = {name: tmp_path / f"{name}.frozen" for name in KILLED}
    for name, after in KILLED.items():
        relays.append(
            RelayProcess(
                tmp_path,
                name,
                odb.url,
                url,
                "--batch",
                "6",
                "--lease",
                "2.5",
                "--freeze-after",
                str(after),
                "--frozen",
                str(frozen_files[name]),
            )
        )

    # While they run: more events, and some in transactions that roll back (these must never go out).
    ids += add_events(outbox, interleaved(aggregates=20, per_aggregate=3, aggregate_type="order"), per_transaction=7)
    for n in range(5):
        with pytest.raises(RuntimeError, match="rolled back"):
            add_then_roll_back(outbox, f"ghost-{n}")

    frozen: dict[str, set[int]] = {}
    killed_at: dict[str, datetime] = {}
    for relay in relays:
        if relay.name in KILLED:
            frozen_file = frozen_files[relay.name]
            wait_until(
                lambda relay=relay, frozen_file=frozen_file: frozen_file.exists() or not relay.alive(),
                timeout=60,
                what=f"{relay.name} to confirm its batch {KILLED[relay.name]}",
            )
            assert relay.alive(), relay.output()
            frozen[relay.name] = set(json.loads(frozen_file.read_text()))
            relay.kill()
            assert relay.wait(10) == -signal.SIGKILL
    rows = odb.by_id()
    for name, batch in frozen.items():
        assert batch, f"{name} froze on an empty batch"
        for event_id in batch:
            # Published, not marked: still held by the dead relay until its lease runs out.
            assert (rows[event_id].status, rows[event_id].lease_owner) == ("processing", name)
        killed_at[name] = max(aware(rows[event_id].lease_expires_at) for event_id in batch)

    wait_until(lambda: odb.all_published(len(ids)), timeout=60, what="every committed event to be published")
    for relay in relays:
        if relay.name not in KILLED:
            relay.terminate()
            assert relay.wait(20) == 0, relay.output()
            stats = relay.stats()
            assert (stats["lost"], stats["retried"], stats["abandoned"]) == (0, 0, 0), stats
            assert stats["published"] > 0, f"{relay.name} published nothing: {stats}"

    # The broker's side.
    entries = read_stream(redis_url, f"{redis_prefix}.order")
    delivered = Counter(int(fields["id"]) for _, fields in entries)
    assert set(delivered) == set(ids), (
        f"lost: {sorted(set(ids) - set(delivered))}; never committed: {sorted(set(delivered) - set(ids))}"
    )
    assert not any(fields["aggregate_id"].startswith("ghost-") for _, fields in entries), "a rolled-back event went out"
    duplicated = {event_id for event_id, times in delivered.items() if times > 1}
    all_frozen = set().union(*frozen.values())
    assert duplicated == all_frozen, f"duplicates not from a killed relay's batch: {sorted(duplicated - all_frozen)}"
    assert {delivered[event_id] for event_id in all_frozen} == {2}
    for name, batch in frozen.items():
        deadline = int(killed_at[name].timestamp() * 1000)
        for event_id in batch:
            _, again = [entry_id for entry_id, fields in entries if int(fields["id"]) == event_id]
            assert entry_millis(again) >= deadline, (
                f"event {event_id} of {name} was taken over before its lease expired"
            )

    expected: dict[str, list[int]] = defaultdict(list)
    for row in odb.rows():
        expected[row.aggregate_id].append(row.id)
    seen = ids_per_aggregate(entries)
    assert sorted(seen) == sorted(expected)
    for aggregate, created in expected.items():
        assert first_deliveries_in_order(seen[aggregate]) == created, (
            f"aggregate {aggregate} arrived as {seen[aggregate]}, created as {created}"
        )

    # The database's side agrees: published once, or twice for the killed relays' batches.
    for row in odb.rows():
        assert row.status == PUBLISHED
        assert (row.attempts, row.retry_count) == (2 if row.id in all_frozen else 1, 0), row


# -- the database restarted under the relays --------------------------------------------------------------


@pytest.mark.parametrize("family", ["postgresql", "mariadb"])
def test_relays_ride_out_database_restarts_and_keep_each_aggregate_in_order(
    request: pytest.FixtureRequest,
    family: str,
    redis_url: str,
    redis_prefix: str,
    relays: list[RelayProcess],
    tmp_path: Path,
) -> None:
    server = start_throwaway(request, family)
    engine = dibs.create_engine(server.url)
    try:
        dibs.migrate(engine)
        outbox = dibs.Outbox(engine)
        ids = add_events(outbox, interleaved(aggregates=60, per_aggregate=5), per_transaction=60)
        url = redis_publisher_url(redis_url, redis_prefix)
        stream = f"{redis_prefix}.order"
        for n in range(2):
            relays.append(
                RelayProcess(
                    tmp_path,
                    f"relay-{n}",
                    server.url,
                    url,
                    "--batch",
                    "8",
                    "--concurrency",
                    "2",
                    "--lease",
                    "2",
                    "--slow",
                    "0.03",
                    "--jitter",
                    "0.03",
                )
            )
        # A relay still starting when the server goes down fails at once, as it should: restart only a running one.
        wait_until(
            lambda: all(relay.ready.exists() or not relay.alive() for relay in relays),
            timeout=60,
            what="both relays to start",
        )
        for share, mode in ((0.25, "fast"), (0.55, "immediate")):
            wait_until(
                lambda share=share: (
                    len(read_stream(redis_url, stream)) >= share * len(ids)
                    or not all(relay.alive() for relay in relays)
                ),
                timeout=60,
                what=f"{share:.0%} of the events to reach the broker before the {mode} restart",
            )
            server.restart(mode)
        engine.dispose()

        def all_published() -> bool:
            with engine.connect() as conn:
                statuses = conn.execute(sa.select(outbox_table.c.status).distinct()).scalars().all()
            return list(statuses) == [PUBLISHED]

        wait_until(
            lambda: all_published() or not all(relay.alive() for relay in relays),
            timeout=60,
            what="every event to be published after the restarts",
        )
        for relay in relays:
            assert relay.alive(), f"{relay.name} gave up on the database:\n{relay.output()[-4000:]}"
            relay.terminate()
        for relay in relays:
            assert relay.wait(20) == 0, relay.output()[-4000:]
        with engine.connect() as conn:
            created = conn.execute(
                sa.select(outbox_table.c.aggregate_id, outbox_table.c.id).order_by(outbox_table.c.id)
            ).all()
    finally:
        engine.dispose()

    assert server.restarts == 2
    database_gone = re.compile(r"claiming outbox events failed|could not record|heartbeat failed|upkeep failed")
    assert any(database_gone.search(relay.output()) for relay in relays), "no relay noticed the database go away"
    entries = read_stream(redis_url, stream)
    delivered = Counter(int(fields["id"]) for _, fields in entries)
    assert set(delivered) == set(ids), f"lost: {sorted(set(ids) - set(delivered))}"
    expected: dict[str, list[int]] = defaultdict(list)
    for aggregate, event_id in created:
        expected[aggregate].append(event_id)
    seen = ids_per_aggregate(entries)
    for aggregate, order in expected.items():
        assert first_deliveries_in_order(seen[aggregate]) == order, (
            f"aggregate {aggregate} arrived as {seen[aggregate]}, created as {order}"
        )
