"""Names and keys compare byte for byte on every database: case, accents and trailing spaces make them differ.

MySQL and MariaDB compare text by the column's collation, and their defaults fold case and accents and ignore
trailing spaces; these tests hold on every backend and would fail there without dibs's own collation.
"""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa

import dibs
from dibs.dialects.base import Name
from dibs.dialects.mysql import exact_collation
from dibs.schema import LATEST, MIGRATIONS, current_version, jobs, metadata
from tests.queue.database import QueueDatabase
from tests.queue.support import job_rows

#: Pairs that a case-, accent- or pad-insensitive collation takes for equal.
LOOKALIKES = [("receipt-Bob", "receipt-bob"), ("cafe", "café"), ("k", "k ")]


def test_every_name_column_of_the_dibs_tables_compares_exactly() -> None:
    """A name column added later cannot be forgotten: every string column of dibs's tables is a Name."""
    strings = [
        f"{table.name}.{column.name}"
        for table in metadata.tables.values()
        for column in table.columns
        if isinstance(column.type, sa.String) and not isinstance(column.type, sa.Text)
    ]
    assert strings
    plain = [
        f"{table.name}.{column.name}"
        for table in metadata.tables.values()
        for column in table.columns
        if isinstance(column.type, sa.String) and not isinstance(column.type, (sa.Text, Name))
    ]
    assert plain == []


def test_dedupe_keys_differing_by_case_accent_or_trailing_space_are_distinct_jobs(qdb: QueueDatabase) -> None:
    app = qdb.app()

    @app.task(name="shop.send_receipt")
    def send_receipt() -> None: ...

    for first, second in LOOKALIKES:
        one = app.enqueue(send_receipt, dedupe_key=first)
        other = app.enqueue(send_receipt, dedupe_key=second)
        assert one.id != other.id, (first, second)
        assert (one.dedupe_key, other.dedupe_key) == (first, second)
        # Each key still names its own live job.
        assert app.enqueue(send_receipt, dedupe_key=second).id == other.id
        assert app.enqueue(send_receipt, dedupe_key=first).id == one.id
    assert len(job_rows(qdb.engine)) == 2 * len(LOOKALIKES)


def test_ordering_keys_differing_by_case_accent_or_trailing_space_are_distinct_keys(qdb: QueueDatabase) -> None:
    """Jobs of one key are claimed one at a time; lookalike keys are different keys, claimed together."""
    app = qdb.app()

    @app.task(name="shop.ship")
    def ship() -> None: ...

    keys = [key for pair in LOOKALIKES for key in pair]
    for key in keys:
        app.enqueue(ship, ordering_key=key)
        app.enqueue(ship, ordering_key=key)  # waits behind the first of its key
    claimed = app.store.claim(
        qdb.engine, owner="test", lease_seconds=30, limit=100, queues=["default"], tasks=["shop.ship"], tags=[]
    )
    assert sorted(lease.row._mapping["id"] for lease in claimed) == [row.id for row in job_rows(qdb.engine)][::2]


def test_a_worker_never_claims_a_task_or_queue_differing_only_by_case(qdb: QueueDatabase) -> None:
    other_app = qdb.app(queues=["Q", "q"])

    @other_app.task(name="Q.send")
    def lower() -> None: ...

    not_ours = [other_app.enqueue(lower).id, other_app.enqueue("Q.send", queue="Q").id]
    app = qdb.app(queues=["q"])
    ran: list[str] = []

    @app.task(name="Q.Send")
    def upper() -> None:
        ran.append("Q.Send")

    @app.task(name="mail.send", queue="q")
    def mail() -> None:
        ran.append("mail.send")

    ours = app.enqueue(upper).id
    other_app.enqueue("Q.send", queue="q")  # our queue, but not our task
    stats = qdb.drain(app, timeout=20)
    assert (stats.claimed, ran) == (1, ["Q.Send"])
    assert app.get(ours).status == "succeeded"
    for job_id in not_ours:
        job = app.get(job_id)
        assert (job.status, job.attempts) == ("queued", 0)
    # A worker of queue "q" only leaves queue "Q"'s jobs alone.
    only_q = qdb.app(queues=["q", "Q"])

    @only_q.task(name="Q.send")
    def lower_too() -> None: ...

    assert qdb.drain(only_q, queues=["q"]).claimed == 1
    assert app.get(not_ours[1]).status == "queued"


def test_schedules_named_alike_are_two_schedules(qdb: QueueDatabase) -> None:
    app = qdb.app()

    @app.task(name="reports.build")
    def build() -> None: ...

    app.periodic(every=timedelta(hours=1), name="Nightly")(build)
    app.periodic(every=timedelta(hours=2), name="nightly")(build)
    app.sync_periodic()
    assert sorted((row.name, row.schedule) for row in app.periodic_status()) == [
        ("Nightly", "every 3600s"),
        ("nightly", "every 7200s"),
    ]


def test_outbox_aggregates_differing_only_by_case_are_ordered_independently(qdb: QueueDatabase) -> None:
    """Only the head of an aggregate is published; lookalike aggregates (and targets) each have their own head."""
    outbox = dibs.Outbox(qdb.engine)
    heads = []
    with qdb.engine.begin() as conn:
        for aggregate_type, aggregate_id in [("Order", "A1"), ("order", "A1"), ("order", "a1"), ("ordér", "a1")]:
            heads.append(outbox.add(conn, aggregate_type, aggregate_id, "order.placed", {"step": 1}))
            outbox.add(conn, aggregate_type, aggregate_id, "order.placed", {"step": 2})
        outbox.add(conn, "order", "b", "Order.Placed", {}, target="Kafka")
        outbox.add(conn, "order", "b", "order.placed", {}, target="kafka")
    claimed = outbox.store.claim(qdb.engine, owner="test", limit=100, target="default", lease_seconds=30)
    assert sorted(lease.key[0] for lease in claimed) == heads
    upper = outbox.store.claim(qdb.engine, owner="test", limit=100, target="Kafka", lease_seconds=30)
    assert [lease.row.event_type for lease in upper] == ["Order.Placed"]
    assert [event.event_type for event in outbox.events(target="kafka")] == ["order.placed"]
    assert [event.aggregate_id for event in outbox.events(aggregate_type="Order")] == ["A1", "A1"]


# -- the upgrade of tables made by an earlier dibs -------------------------------------------------------


def with_folding_names(engine: sa.Engine) -> None:
    """The dibs tables as versions before 4 made them: on MySQL and MariaDB, in the database's default
    collation (one that folds case and accents and pads). Other databases have no such collation."""
    if engine.dialect.name != "mysql":
        return
    with engine.begin() as conn:
        for table in ("dibs_jobs", "dibs_outbox", "dibs_periodic"):
            conn.exec_driver_sql(f"ALTER TABLE {table} CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci")


def test_tables_of_an_earlier_version_are_upgraded_to_compare_exactly(empty_db: QueueDatabase) -> None:
    engine = empty_db.engine
    before = [step for step in MIGRATIONS if step.version < 4]
    dibs.migrate(engine, tuple(before))
    with_folding_names(engine)
    app = empty_db.app()

    @app.task(name="shop.send_receipt")
    def send_receipt() -> None: ...

    kept = app.enqueue(send_receipt, dedupe_key="receipt-Bob")
    assert dibs.migrate(engine)[0].version == 4
    assert current_version(engine) == LATEST
    outbox = dibs.Outbox(engine)
    with engine.begin() as conn:
        outbox.add(conn, "Order", "A1", "order.placed", {})
        outbox.add(conn, "order", "a1", "order.placed", {})
    for first, second in LOOKALIKES:
        assert app.enqueue(send_receipt, dedupe_key=first).id != app.enqueue(send_receipt, dedupe_key=second).id
    assert app.enqueue(send_receipt, dedupe_key="receipt-Bob").id == kept.id
    claimed = outbox.store.claim(engine, owner="test", limit=10, target="default", lease_seconds=30)
    assert len(claimed) == 2  # two aggregates, each its own head
    if engine.dialect.name == "mysql":
        with engine.connect() as conn:
            collations = conn.execute(
                sa.text(
                    "SELECT DISTINCT collation_name FROM information_schema.columns WHERE table_schema = DATABASE() "
                    "AND table_name LIKE 'dibs%' AND data_type = 'varchar'"
                )
            ).scalars()
            assert set(collations) == {exact_collation(engine.dialect)}
    assert len(job_rows(engine, jobs.c.dedupe_key.is_not(None))) == 2 * len(LOOKALIKES)
