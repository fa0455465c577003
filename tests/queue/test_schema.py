"""Migrations, retention, queue status and the worker's Prometheus metrics."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

import dibs
from dibs.schema import LATEST, MIGRATIONS, Migration, current_version, require_current
from dibs.schema.migrations import MIGRATE_TRIES
from tests.helpers import wait_until
from tests.helpers.network import answers, free_port, outward_address
from tests.queue.database import QueueDatabase
from tests.queue.support import database_now, job_rows

# -- migrations ----------------------------------------------------------------------------------------


#: Every version this dibs has, in order.
VERSIONS = [step.version for step in MIGRATIONS]


def test_migrate_creates_the_tables_once(empty_db: QueueDatabase) -> None:
    engine = empty_db.engine
    assert current_version(engine) == 0
    assert [step.version for step in dibs.migrate(engine)] == VERSIONS == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert current_version(engine) == LATEST
    assert dibs.migrate(engine) == []
    assert empty_db.app().init() == []
    assert {"dibs_jobs", "dibs_job_parents", "dibs_outbox", "dibs_periodic", "dibs_schema", "dibs_workers"} <= set(
        sa.inspect(engine).get_table_names()
    )
    require_current(engine)
    with engine.connect() as conn:
        applied = conn.execute(sa.select(dibs.schema.schema_versions)).all()
    assert [row.version for row in applied] == VERSIONS


def test_a_version_1_database_with_jobs_gains_the_outbox(empty_db: QueueDatabase) -> None:
    """A database made by a dibs before the outbox: its jobs stay, the outbox table is added."""
    engine = empty_db.engine
    assert [step.version for step in dibs.migrate(engine, MIGRATIONS[:1])] == [1]
    assert "dibs_outbox" not in sa.inspect(engine).get_table_names()
    app = empty_db.app()

    @app.task(name="work.do")
    def do(n: int) -> None: ...

    kept = app.enqueue(do, {"n": 1})
    with pytest.raises(dibs.SchemaMissing, match=f"has dibs schema version 1, this dibs needs {LATEST}"):
        require_current(engine)
    assert [step.version for step in dibs.migrate(engine)] == VERSIONS[1:]
    assert "dibs_outbox" in sa.inspect(engine).get_table_names()
    assert app.get(kept.id).status == "queued"
    outbox = dibs.Outbox(engine)
    with engine.begin() as conn:
        outbox.add(conn, "order", 1, "order.placed", {"total": 5})
    assert [event.event_type for event in outbox.events(status="pending")] == ["order.placed"]


def migrate_at_once(db: QueueDatabase, count: int) -> tuple[list[int], list[BaseException]]:
    """``count`` threads run dibs.migrate at the same moment, each with an engine of its own; the versions
    they applied and the errors they raised."""
    start = threading.Barrier(count)
    applied: list[int] = []
    errors: list[BaseException] = []

    def init() -> None:
        engine = db.new_engine()
        try:
            start.wait()
            applied.extend(step.version for step in dibs.migrate(engine))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=init) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return applied, errors


def test_processes_migrating_at_once_all_succeed_and_apply_each_step_once(empty_db: QueueDatabase) -> None:
    for _ in range(3):
        dibs.schema.metadata.drop_all(empty_db.engine)
        applied, errors = migrate_at_once(empty_db, 3)
        assert errors == []
        assert sorted(applied) == VERSIONS
        with empty_db.engine.connect() as conn:
            assert conn.execute(sa.select(dibs.schema.schema_versions.c.version)).scalars().all() == VERSIONS
    require_current(empty_db.engine)


def test_a_worker_on_a_database_without_the_tables_says_to_run_dibs_init(empty_db: QueueDatabase) -> None:
    app = empty_db.app()

    @app.task(name="work.do")
    def do() -> None: ...

    before = {thread for thread in threading.enumerate() if thread.name.startswith("dibs-")}
    with pytest.raises(dibs.SchemaMissing, match=r"the database has no dibs tables; run `dibs --db URL init`"):
        empty_db.worker(app, burst=True).run()
    leftover = {thread for thread in threading.enumerate() if thread.name.startswith("dibs-")} - before
    assert not leftover, f"the failed worker left threads running: {leftover}"
    assert app.init() == VERSIONS
    empty_db.drain(app)


def test_every_app_call_on_a_database_without_the_tables_says_to_run_dibs_init(empty_db: QueueDatabase) -> None:
    app = empty_db.app()

    @app.task(name="work.do")
    def do() -> None: ...

    calls = {
        "enqueue": lambda: app.enqueue(do),
        "get": lambda: app.get(1),
        "jobs": app.jobs,
        "cancel": lambda: app.cancel(1),
        "retry": lambda: app.retry(1),
        "purge": app.purge,
        "purgeable": app.purgeable,
        "status": app.status,
        "workers": app.workers,
        "stranded_jobs": app.stranded_jobs,
    }
    wrong = []
    for name, call in calls.items():
        try:
            call()
        except dibs.SchemaMissing as error:
            if "run `dibs --db URL init`" not in str(error):
                wrong.append(f"{name}: {error}")
        except Exception as error:
            wrong.append(f"{name}: {type(error).__name__}")
        else:
            wrong.append(f"{name}: no error")
    assert wrong == []


def _add_note(conn: Connection) -> None:
    conn.execute(sa.text("ALTER TABLE dibs_jobs ADD COLUMN note VARCHAR(50)"))


def test_a_newer_migration_upgrades_a_current_database(empty_db: QueueDatabase) -> None:
    engine = empty_db.engine
    step_next = Migration(version=LATEST + 1, description="a note on each job", apply=_add_note)
    newer = (*MIGRATIONS, step_next)
    assert [step.version for step in dibs.migrate(engine)] == VERSIONS
    app = empty_db.app()

    @app.task(name="work.do")
    def do(n: int) -> None: ...

    kept = app.enqueue(do, {"n": 1})
    with pytest.raises(
        dibs.SchemaMissing,
        match=f"has dibs schema version {LATEST}, this dibs needs {LATEST + 1}; run `dibs --db URL init",
    ):
        require_current(engine, newer)

    assert dibs.migrate(engine, newer) == [step_next]
    assert current_version(engine) == LATEST + 1
    assert "note" in {column["name"] for column in sa.inspect(engine).get_columns("dibs_jobs")}
    assert dibs.migrate(engine, newer) == []
    require_current(engine, newer)
    require_current(engine)  # code that needs the current version runs on a newer database
    # The jobs enqueued before the upgrade are still there, and the queue works on the upgraded table.
    assert app.get(kept.id).status == "queued"
    empty_db.drain(app)
    assert app.get(kept.id).status == "succeeded"


def test_a_failed_migration_is_not_recorded_and_runs_again(empty_db: QueueDatabase) -> None:
    engine = empty_db.engine
    dibs.migrate(engine)

    def broken(conn: Connection) -> None:
        raise RuntimeError(f"migration {LATEST + 1} failed")

    with pytest.raises(RuntimeError, match=f"migration {LATEST + 1} failed"):
        dibs.migrate(engine, (*MIGRATIONS, Migration(version=LATEST + 1, description="broken", apply=broken)))
    assert current_version(engine) == LATEST
    step_next = Migration(version=LATEST + 1, description="a note on each job", apply=_add_note)
    assert dibs.migrate(engine, (*MIGRATIONS, step_next)) == [step_next]
    assert current_version(engine) == LATEST + 1


# -- retention and status ------------------------------------------------------------------------------


def finished_and_live_jobs(qdb: QueueDatabase) -> tuple[dibs.App, dict[str, int]]:
    """An app with one job in each state but running: finished ones on "default", waiting ones on "later"."""
    app = qdb.app(queues=["later"])

    @app.task(name="work.ok")
    def ok() -> None: ...

    @app.task(name="work.fail", max_attempts=1)
    def fail() -> None:
        raise RuntimeError("broken")

    ids = {
        "succeeded": app.enqueue(ok).id,
        "dead": app.enqueue(fail).id,
        "cancelled": app.cancel(app.enqueue(ok).id).id,
        "scheduled": app.enqueue(ok, queue="later", delay=3600).id,
        "queued": app.enqueue(ok, queue="later").id,
    }
    qdb.drain(app, queues=["default"])
    assert {row.id: row.status for row in job_rows(qdb.engine)} == {job_id: state for state, job_id in ids.items()}
    return app, ids


def test_purge_deletes_finished_jobs_and_keeps_live_ones(qdb: QueueDatabase) -> None:
    app, ids = finished_and_live_jobs(qdb)
    assert app.purgeable(older_than=timedelta(hours=1)) == {}
    assert app.purge(older_than=timedelta(hours=1)) == 0
    time.sleep(0.01)
    assert app.purgeable() == {"succeeded": 1, "dead": 1, "cancelled": 1}
    assert app.purgeable(statuses=["dead", "succeeded"]) == {"succeeded": 1, "dead": 1}
    assert app.purge(older_than=timedelta(0), statuses=["dead"]) == 1
    with pytest.raises(dibs.JobNotFound):
        app.get(ids["dead"])
    time.sleep(0.01)
    assert app.purge(older_than=timedelta(0)) == 2
    assert {row.id: row.status for row in job_rows(qdb.engine)} == {
        ids["scheduled"]: "scheduled",
        ids["queued"]: "queued",
    }
    with pytest.raises(dibs.InvalidArgument, match="only finished jobs can be purged"):
        app.purge(statuses=["queued"])


def test_a_worker_with_retention_purges_finished_jobs(qdb: QueueDatabase) -> None:
    app, ids = finished_and_live_jobs(qdb)
    running = qdb.start(app, queues=["default"], retention=timedelta(0))
    wait_until(lambda: len(job_rows(qdb.engine)) == 2, timeout=10, what="the finished jobs to be purged")
    running.stop()
    assert {row.id for row in job_rows(qdb.engine)} == {ids["scheduled"], ids["queued"]}


def test_status_counts_jobs_per_queue_and_state(qdb: QueueDatabase) -> None:
    app, _ = finished_and_live_jobs(qdb)
    by_queue = {status.queue: status for status in app.status()}
    assert set(by_queue) == {"default", "later"}
    default, later = by_queue["default"], by_queue["later"]
    assert default.counts == {
        "waiting": 0,
        "scheduled": 0,
        "queued": 0,
        "running": 0,
        "succeeded": 1,
        "dead": 1,
        "cancelled": 1,
    }
    assert default.oldest_ready_seconds is None
    assert default.finished_per_second == pytest.approx(3 / 60)
    assert (later.counts["queued"], later.counts["scheduled"], later.finished_per_second) == (1, 1, 0.0)
    assert later.oldest_ready_seconds is not None
    assert 0 <= later.oldest_ready_seconds < 30
    assert [job.status for job in app.jobs(status=["dead", "cancelled"])] == ["cancelled", "dead"]
    assert [job.status for job in app.jobs(queue="later")] == ["queued", "scheduled"]
    assert len(app.jobs(task="work.fail")) == 1
    with pytest.raises(dibs.InvalidArgument, match="unknown job state"):
        app.jobs(status="finished")


# -- metrics -------------------------------------------------------------------------------------------


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def test_a_worker_serves_prometheus_metrics(qdb: QueueDatabase) -> None:
    app = qdb.app()

    @app.task(name="work.ok")
    def ok() -> None: ...

    @app.task(name="work.fail", max_attempts=1)
    def fail() -> None:
        raise RuntimeError("broken")

    app.enqueue_many(ok, [{}, {}, {}])
    app.enqueue(fail)
    port = free_port()
    running = qdb.start(app, metrics_port=port)
    try:
        wanted = {
            "dibs_jobs_claimed_total": 4.0,
            'dibs_jobs_finished_total{outcome="succeeded",task="work.ok"}': 3.0,
            'dibs_jobs_finished_total{outcome="dead",task="work.fail"}': 1.0,
            'dibs_queue_jobs{queue="default",state="succeeded"}': 3.0,
            'dibs_queue_jobs{queue="default",state="dead"}': 1.0,
        }

        def counted() -> bool:
            try:
                samples = scrape(port)
            except urllib.error.URLError:  # not serving yet
                return False
            return all(samples.get(name) == value for name, value in wanted.items())

        wait_until(counted, timeout=10, interval=0.1, what=f"the metrics to show {wanted}")
        samples = scrape(port)
        assert samples['dibs_job_run_seconds_count{task="work.ok"}'] == 3.0
        assert samples["dibs_claim_seconds_count"] >= 1
    finally:
        running.stop()
    # A stopped worker stops serving, and the port is free for the next one.
    with pytest.raises(urllib.error.URLError):
        scrape(port)
    with socket.create_server(("127.0.0.1", port)):
        pass


@pytest.mark.parametrize("address", [None, "0.0.0.0"])
def test_metrics_are_served_on_loopback_unless_an_address_opens_them_wider(
    qdb: QueueDatabase, address: str | None
) -> None:
    outward = outward_address()
    if outward is None:
        pytest.skip("this machine has no network address besides loopback to try the metrics port from")
    app = qdb.app()

    @app.task(name="work.ok")
    def ok() -> None: ...

    port = free_port()
    running = qdb.start(app, metrics_port=port, **({} if address is None else {"metrics_address": address}))
    try:
        wait_until(lambda: answers("127.0.0.1", port), timeout=10, what="the metrics port to open")
        assert answers(outward, port) is (address == "0.0.0.0")
    finally:
        running.stop()


def test_a_bad_metrics_address_is_refused_when_the_worker_is_made(qdb: QueueDatabase) -> None:
    app = qdb.app()

    @app.task(name="work.ok")
    def ok() -> None: ...

    for address in ("", None, 127):
        with pytest.raises(dibs.InvalidArgument, match="metrics_address must be a host name or IP address"):
            qdb.worker(app, metrics_port=free_port(), metrics_address=address)


def test_migrations_record_when_they_ran_in_utc_whatever_the_session_time_zone(empty_db: QueueDatabase) -> None:
    engine = empty_db.engine
    with engine.connect() as conn:
        if empty_db.family == "postgresql":
            conn.execute(sa.text("SET TIME ZONE '+05:00'"))
        elif empty_db.family == "mariadb":
            conn.execute(sa.text("SET time_zone = '+05:00'"))
        conn.commit()
        dibs.migrate(conn)
        moments = conn.execute(sa.select(dibs.schema.schema_versions.c.applied_at)).scalars().all()
    assert len(moments) == LATEST
    for applied_at in moments:
        aware = applied_at if applied_at.tzinfo is not None else applied_at.replace(tzinfo=timezone.utc)
        assert abs(aware - database_now(engine)) < timedelta(minutes=1)


def _colliding_steps(count: int, *, progress: bool) -> tuple[Migration, ...]:
    """Steps that each collide once with another process's migration: that process records the step (when
    ``progress``) and this one's statement fails, as a duplicate column or version row would."""

    def colliding(version: int) -> Callable[[Connection], None]:
        def apply(conn: Connection) -> None:
            if progress:
                with conn.engine.begin() as other:
                    other.execute(
                        dibs.schema.schema_versions.insert().values(
                            version=version, applied_at=datetime.now(timezone.utc)
                        )
                    )
            conn.exec_driver_sql("SELECT * FROM a_table_another_migration_dropped")

        return apply

    return tuple(Migration(version=v, description=f"step {v}", apply=colliding(v)) for v in range(1, count + 1))


def test_migrate_goes_on_through_many_collisions_while_others_record_steps(tmp_path: Path) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'collide.sqlite'}")
    steps = _colliding_steps(3 * MIGRATE_TRIES, progress=True)
    assert dibs.migrate(engine, steps) == []  # every step was recorded by the other process
    assert current_version(engine) == len(steps)
    engine.dispose()


def test_migrate_gives_up_when_collisions_go_on_and_nobody_records_a_step(tmp_path: Path) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'stuck.sqlite'}")
    with pytest.raises(sa.exc.OperationalError, match="a_table_another_migration_dropped"):
        dibs.migrate(engine, _colliding_steps(1, progress=False))
    assert current_version(engine) == 0
    engine.dispose()
