"""Bad input gets a clear error that says what to do, and nothing is written or lost.

End to end, on PostgreSQL, SQLite and MariaDB: workers running while bad rows sit among good ones, the
``dibs`` command run as a subprocess exactly as a user types it, and every claim checked from the
database afterwards. The argument checks of enqueue and add one by one are in tests/queue/test_enqueue.py
and tests/outbox/test_outbox.py; these are the cases that cross a boundary (a row another program wrote,
a caller's transaction, the command line, a URL, a table that went away).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

import dibs
from dibs.dialects import backend_for
from dibs.schema import jobs
from dibs.schema import outbox as outbox_table
from tests.helpers import BACKENDS, wait_until
from tests.helpers.targets import SYNC_DRIVERS, database_url
from tests.queue.database import QueueDatabase
from tests.queue.support import drop_everything, job_count, job_rows, orders, test_metadata

DIBS = str(Path(sys.executable).with_name("dibs"))
ROOT = Path(__file__).resolve().parents[2]
APP = "tests.acceptance.cli_app:app"  # tasks greet(name), explode(), sleepy(seconds); queues default, spare

EVIL = ("x'); DROP TABLE dibs_jobs; --", '" OR 1=1 --')


# -- fixtures and helpers ----------------------------------------------------------------------------------


@pytest.fixture(params=BACKENDS)
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.URL]:
    """A database without dibs tables: the session's on the servers, a file in tmp_path on SQLite."""
    url = database_url(request, request.param, SYNC_DRIVERS[request.param], tmp_path / "chaos.sqlite")
    drop_everything(url)
    yield url
    drop_everything(url)


@pytest.fixture
def qdb(empty_url: sa.URL) -> Iterator[QueueDatabase]:
    """A database with the current dibs tables, and the apps and workers of one test on it."""
    database = QueueDatabase(empty_url)
    try:
        dibs.migrate(database.engine)
        yield database
    finally:
        database.close()


def cli(database: sa.URL | str, tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    """Start `dibs --db DATABASE ARGS...` as a user types it (the caller collects it with finish())."""
    url = database if isinstance(database, str) else database.render_as_string(hide_password=False)
    env = {**os.environ, "DIBS_CLI_TEST_OUT": str(tmp_path / "out.txt"), "COLUMNS": "200"}
    env.pop("DIBS_DATABASE_URL", None)
    return subprocess.Popen(
        [DIBS, "--db", url, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=60)
    return process.returncode, out, err


def run_cli(database: sa.URL | str, tmp_path: Path, *args: str) -> tuple[int, str, str]:
    return finish(cli(database, tmp_path, *args))


def assert_one_line_error(result: tuple[int, str, str], *says: str, where: str = "") -> None:
    """A failed command: non-zero exit, no traceback, one line on stderr holding each of ``says``."""
    code, out, err = result
    assert code != 0, (where, out)
    assert "Traceback" not in err, (where, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, (where, err)
    for text in says:
        assert text in lines[0], (where, lines[0])


def write_raw_job(engine: sa.Engine, task: str, args: str, *, max_attempts: int = 5) -> int:
    """Insert a queued job directly into dibs_jobs, as a buggy producer in another language might."""
    now = backend_for(engine.dialect).now()
    with engine.begin() as conn:
        result = conn.execute(
            jobs.insert().values(
                task=task,
                queue="default",
                args=args,
                status="queued",
                run_at=now,
                max_attempts=max_attempts,
                enqueued_at=now,
            )
        )
        key = result.inserted_primary_key
        assert key is not None
        return int(key[0])


def job_states(engine: sa.Engine) -> dict[int, str]:
    return {row.id: row.status for row in job_rows(engine)}


def table_names(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        return set(sa.inspect(conn).get_table_names())


def drop_jobs_table(engine: sa.Engine) -> None:
    """DROP TABLE dibs_jobs, retried while a worker's statement briefly holds it."""
    deadline = time.monotonic() + 20
    while True:
        try:
            with engine.begin() as conn:
                if conn.dialect.name == "postgresql":
                    conn.exec_driver_sql("SET LOCAL lock_timeout = '2s'")
                elif conn.dialect.name in ("mysql", "mariadb"):
                    conn.exec_driver_sql("SET SESSION lock_wait_timeout = 2")
                conn.exec_driver_sql("DROP TABLE dibs_jobs")
            return
        except sa.exc.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


# -- 1. malformed task arguments ---------------------------------------------------------------------------

MALFORMED = [
    ("{not json", ["not valid JSON"]),
    ("[1, 2]", ["not a JSON object", "list"]),
    ("null", ["not a JSON object"]),
    ('{"m": 1}', ["do not fit", "takes (n)", "missing a required argument: 'n'"]),
    ("{}", ["do not fit", "missing a required argument: 'n'"]),
    ('{"n": 1, "extra": 2}', ["do not fit", "'extra'"]),
]


def test_a_running_worker_buries_jobs_with_malformed_stored_args_at_once_and_runs_the_rest(qdb: QueueDatabase) -> None:
    app = qdb.app()
    added: list[int] = []

    @app.task(name="chaos.add", max_attempts=5)  # the default retry would retry a TypeError four times
    def add(n: int) -> None:
        added.append(n)

    good = [add.enqueue({"n": n}).id for n in (1, 2, 3)]
    bad = {write_raw_job(qdb.engine, "chaos.add", raw): says for raw, says in MALFORMED}
    running = qdb.start(app)
    started = time.monotonic()
    wait_until(
        lambda: all(state in ("succeeded", "dead") for state in job_states(qdb.engine).values()),
        timeout=20,
        what="every job to finish",
    )
    # Dead at the first attempt, not after four retries or lease expiries.
    assert time.monotonic() - started < 5
    rows = {row.id: row for row in job_rows(qdb.engine)}
    assert len(rows) == len(good) + len(bad)  # nothing lost
    assert {job_id: rows[job_id].status for job_id in good} == dict.fromkeys(good, "succeeded")
    assert sorted(added) == [1, 2, 3]
    for job_id, says in bad.items():
        row = rows[job_id]
        assert (row.status, row.attempts) == ("dead", 1), row
        first_line = row.last_error.splitlines()[0]
        assert first_line.startswith("InvalidArgument: "), first_line
        for text in (*says, f"job {job_id}", "chaos.add", "enqueue it again"):
            assert text in first_line, first_line
    # The worker neither crashed nor stalled: a job enqueued now still runs.
    late = add.enqueue({"n": 4})
    wait_until(lambda: app.get(late.id).status == "succeeded", timeout=10, what="a later job to run")
    assert running.thread.is_alive()
    assert running.worker.stats.dead == len(bad)


# -- 2. unknown tasks, and the command line on bad input ----------------------------------------------------


def test_a_job_of_a_task_no_worker_has_waits_visible_for_one_that_has_it(qdb: QueueDatabase, tmp_path: Path) -> None:
    stranger = write_raw_job(qdb.engine, "billing.refund", '{"order": 7}')
    # From the command line: an unknown task, args that are not an object or not JSON-clean, a name that is
    # not a name: one line each, a non-zero exit, nothing written.
    refused = [
        (cli(qdb.url, tmp_path, "enqueue", APP, "billing.refund"), ["no task named 'billing.refund'", "greet"]),
        (cli(qdb.url, tmp_path, "enqueue", APP, "greet", "[1, 2]"), ["must be a dict of argument names"]),
        (cli(qdb.url, tmp_path, "enqueue", APP, "greet", '{"name": NaN}'), ["are not JSON", "turn other values"]),
        (cli(qdb.url, tmp_path, "enqueue", APP, EVIL[0]), ["a task name must be 1 to 200 letters"]),
        (cli(qdb.url, tmp_path, "enqueue", APP, "greet", "{}", "--queue", EVIL[1]), ["queue must be 1 to 100"]),
    ]
    for process, says in refused:
        assert_one_line_error(finish(process), *says)
    assert job_count(qdb.engine) == 1

    # A worker without the task runs everything else and leaves the stranger queued, unclaimed.
    code, out, err = run_cli(qdb.url, tmp_path, "enqueue", APP, "greet", '{"name": "ada"}')
    assert code == 0, err
    code, out, err = run_cli(qdb.url, tmp_path, "worker", APP, "--burst")
    assert code == 0, err
    assert "1 succeeded" in out
    assert (tmp_path / "out.txt").read_text() == "hello ada\n"
    row = job_rows(qdb.engine, jobs.c.id == stranger)[0]
    assert (row.status, row.attempts, row.lease_owner) == ("queued", 0, None)

    # Visible to whoever looks.
    status, listed = cli(qdb.url, tmp_path, "status"), cli(qdb.url, tmp_path, "jobs", "list", "--status", "queued")
    code, out, err = finish(status)
    assert code == 0, err
    lines = out.splitlines()
    header = [cell.strip() for cell in next(line for line in lines if "queued" in line).split("┃")]
    default_row = [cell.strip() for cell in next(line for line in lines if "default" in line).split("│")]
    counts = dict(zip(header, default_row, strict=True))
    assert (counts["scheduled"], counts["queued"]) == ("0", "1"), out
    code, out, err = finish(listed)
    assert code == 0, err
    assert "billing.refund" in out
    assert str(stranger) in out

    # A worker that has the task takes it.
    billing = qdb.app()
    refunded: list[int] = []

    @billing.task(name="billing.refund")
    def refund(order: int) -> None:
        refunded.append(order)

    qdb.drain(billing)
    assert refunded == [7]
    assert job_rows(qdb.engine, jobs.c.id == stranger)[0].status == "succeeded"


# -- 3. payloads over the size limit ---------------------------------------------------------------------


def test_oversize_args_and_payloads_in_a_callers_transaction_leave_its_own_writes_to_it(qdb: QueueDatabase) -> None:
    app = qdb.app(max_args_bytes=1000)
    ran: list[str] = []

    @app.task(name="chaos.store")
    def store(blob: str) -> None:
        ran.append(blob[:5])

    events = dibs.Outbox(qdb.engine, max_payload_bytes=1000)
    test_metadata.create_all(qdb.engine)
    before = store.enqueue({"blob": "early"}).id
    big = {"blob": "x" * 2000}
    with qdb.engine.begin() as conn:
        conn.execute(orders.insert().values(id=1, item="cup"))
        with pytest.raises(dibs.InvalidArgument) as too_big:
            store.enqueue(big, conn=conn)
        with pytest.raises(dibs.InvalidArgument):
            app.enqueue_many(store, [{"blob": "fine"}, big], conn=conn)
        with pytest.raises(dibs.InvalidArgument) as payload_too_big:
            events.add(conn, "order", "1", "order.placed", big)
        # The caller decides: it goes on, and commits its own writes and a job and an event that fit.
        conn.execute(orders.insert().values(id=2, item="mug"))
        after = store.enqueue({"blob": "later"}, conn=conn).id
        event = events.add(conn, "order", "1", "order.placed", {"blob": "small"})
    for error, knob in ((too_big, "App(max_args_bytes="), (payload_too_big, "Outbox(max_payload_bytes=")):
        message = str(error.value)
        assert "over the limit of 1,000" in message, message
        assert knob in message, message
        assert "2,0" in message  # how big it was
    with qdb.engine.connect() as conn:
        assert conn.execute(sa.select(orders.c.id).order_by(orders.c.id)).scalars().all() == [1, 2]
        assert conn.execute(sa.select(outbox_table.c.id)).scalars().all() == [event]
    assert [row.id for row in job_rows(qdb.engine)] == [before, after]
    qdb.drain(app)
    assert sorted(ran) == ["early", "later"]


# -- 4. SQL-injection-shaped values ------------------------------------------------------------------------


def test_injection_shaped_names_are_refused_and_free_text_round_trips_verbatim(qdb: QueueDatabase) -> None:
    app = qdb.app()
    seen: list[str] = []

    @app.task(name="chaos.echo", ordering_key="text")
    def echo(text: str) -> None:
        seen.append(text)

    refusals: list[Callable[[str], object]] = [
        lambda evil: echo.enqueue({"text": "x"}, queue=evil),
        lambda evil: echo.enqueue({"text": "x"}, tag=evil),
        lambda evil: app.enqueue(evil, {"text": "x"}),
        lambda evil: app.task(name=evil)(lambda: None),
        lambda evil: dibs.App(qdb.engine, queues=[evil]),
        lambda evil: qdb.worker(app, queues=[evil]),
        lambda evil: qdb.worker(app, tags=[evil]),
    ]
    for evil in EVIL:
        # Names must be identifiers: refused, saying what a name may hold.
        for refusal in refusals:
            with pytest.raises(dibs.InvalidArgument, match=r"must be 1 to \d+ letters, digits or _ \. : -"):
                refusal(evil)
    assert job_count(qdb.engine) == 0
    # Free text is stored and read back as it was written, and looked up by bound parameters.
    stored = {evil: echo.enqueue({"text": evil}, dedupe_key=evil).id for evil in EVIL}
    for evil, job_id in stored.items():
        again = echo.enqueue({"text": "ignored"}, dedupe_key=evil)
        assert again.id == job_id  # the dedupe key matched itself, and only itself
        job = app.get(job_id)
        assert (job.args, job.dedupe_key, job.ordering_key) == ({"text": evil}, evil, evil)
    assert app.jobs(queue=EVIL[1]) == []
    assert app.jobs(task=EVIL[0]) == []
    events = dibs.Outbox(qdb.engine)
    with qdb.engine.begin() as conn:
        ids = {
            evil: events.add(conn, evil, evil, evil, {"text": evil}, headers={"note": evil}, target="t")
            for evil in EVIL
        }
    for evil, event_id in ids.items():
        event = events.get(event_id)
        fields = (event.aggregate_type, event.aggregate_id, event.event_type, event.payload, event.headers)
        assert fields == (evil, evil, evil, {"text": evil}, {"note": evil})
        assert [found.id for found in events.events(aggregate_id=evil)] == [event_id]
    assert events.events(aggregate_id="x") == []
    qdb.drain(app)
    assert sorted(seen) == sorted(EVIL)
    # Every table is still there, with every row.
    assert {"dibs_jobs", "dibs_outbox", "dibs_periodic", "dibs_schema"} <= table_names(qdb.engine)
    assert job_count(qdb.engine) == 2
    with qdb.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(outbox_table)).scalar_one() == 2


def test_claim_with_injection_shaped_criteria_takes_only_the_matching_rows(qdb: QueueDatabase) -> None:
    work = sa.Table(
        "chaos_injection_work",
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("status", sa.String(10), nullable=False),
    )
    work.create(qdb.engine)
    try:
        names = [*EVIL, "x", "plain", "", "1"]
        with qdb.engine.begin() as conn:
            conn.execute(work.insert(), [{"id": i, "name": name, "status": "ready"} for i, name in enumerate(names)])
        taken = dibs.claim(qdb.engine, work, where=work.c.name == EVIL[1], set={"status": "taken"}, limit=10)
        assert [(row.id, row.name) for row in taken] == [(1, EVIL[1])]
        taken = dibs.claim(
            qdb.engine, work, where=[work.c.name.in_([EVIL[0], "nothing"])], set={"status": "taken"}, limit=10
        )
        assert [(row.id, row.name) for row in taken] == [(0, EVIL[0])]
        with qdb.engine.connect() as conn:
            left = conn.execute(sa.select(work.c.name).where(work.c.status == "ready").order_by(work.c.id))
            assert left.scalars().all() == ["x", "plain", "", "1"]
        assert "dibs_jobs" in table_names(qdb.engine)
    finally:
        work.drop(qdb.engine)


# -- 5. wrong database URLs ----------------------------------------------------------------------------------


def test_wrong_database_urls_get_a_one_line_error_from_the_api_and_the_command_line(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    postgres: sa.URL = request.getfixturevalue("postgres_database")
    mariadb: sa.URL = request.getfixturevalue("mariadb_database")
    missing_dir = tmp_path / "no" / "such" / "dir"
    cases: list[tuple[str, list[str]]] = [
        ("nosuchdb://somewhere/app", ["'nosuchdb'", "sqlite:///", "postgresql+psycopg://"]),
        ("sqlite:///" + str(missing_dir / "jobs.sqlite"), [f"directory {missing_dir} does not exist", "create it"]),
        (postgres.set(port=1).render_as_string(hide_password=False), ["could not be reached", "port 1", "--db"]),
        (postgres.set(database="chaos_nowhere").render_as_string(False), ['"chaos_nowhere" does not exist', "--db"]),
        (mariadb.set(database="chaos_nowhere").render_as_string(False), ["Unknown database 'chaos_nowhere'", "--db"]),
    ]
    if importlib.util.find_spec("pg8000") is None:
        url = postgres.set(drivername="postgresql+pg8000").render_as_string(hide_password=False)
        cases.append((url, ["driver 'pg8000'", "not installed", "postgresql+psycopg"]))
    commands = [["status"], ["worker", APP, "--burst"], ["jobs", "list"]]
    started = [(url, says, cli(url, tmp_path, *command)) for url, says in cases for command in commands]
    for url, says, process in started:
        code, out, err = finish(process)
        assert_one_line_error((code, out, err), *says, where=url)

    # The API: a URL that can never work (unknown kind, driver not installed) is refused as the App is made;
    # one that may work later (a server down, a database or directory not made yet) when it is used.
    for url, says in cases:
        if url.startswith("nosuchdb") or "pg8000" in url:
            with pytest.raises(dibs.InvalidArgument) as refused:
                dibs.App(url)
        else:
            app = dibs.App(url)
            with pytest.raises(
                dibs.InvalidArgument if url.startswith("sqlite") else sa.exc.OperationalError
            ) as refused:
                app.status()
            if not url.startswith("sqlite"):
                app.engine.dispose()
        if isinstance(refused.value, dibs.InvalidArgument):
            message = str(refused.value)
            assert "\n" not in message
            assert all(text in message for text in says if text != "--db"), (says, message)
    assert not missing_dir.parent.parent.exists()  # nothing was created on the way


# -- 6. dropped tables ----------------------------------------------------------------------------------------


def test_missing_or_dropped_jobs_table_says_run_dibs_init_and_init_brings_it_back(
    empty_url: sa.URL,
    tmp_path: Path,
) -> None:
    database = QueueDatabase(empty_url)
    try:
        app = database.app()

        @app.task(name="chaos.noop")
        def noop() -> None: ...

        # Never created.
        with pytest.raises(dibs.SchemaMissing, match=r"has no dibs tables; run `dibs --db URL init"):
            noop.enqueue({})
        app.init()
        kept = noop.enqueue({}).id
        drop_jobs_table(database.engine)
        # Dropped after `dibs init`: everything says so, nothing is written.
        for attempt in (lambda: noop.enqueue({}), app.status, lambda: app.jobs(), lambda: database.worker(app).run()):
            with pytest.raises(dibs.SchemaMissing, match=r"lacks the dibs table dibs_jobs.*run `dibs --db URL init"):
                attempt()
        commands = [
            ["status"],
            ["jobs", "list"],
            ["worker", APP, "--burst"],
            ["enqueue", APP, "greet", '{"name": "x"}'],
        ]
        for process in [cli(empty_url, tmp_path, *command) for command in commands]:
            assert_one_line_error(finish(process), "dibs_jobs", "run `dibs --db URL init")
        assert "dibs_jobs" not in table_names(database.engine)

        code, out, err = run_cli(empty_url, tmp_path, "init")
        assert code == 0, err
        assert "created the missing table dibs_jobs" in out
        assert "dibs_jobs" in table_names(database.engine)
        assert job_count(database.engine) == 0  # the dropped job is gone with its table: dibs wrote nothing
        assert kept > 0
        noop.enqueue({})
        assert database.drain(app).succeeded == 1
    finally:
        database.close()


def test_a_worker_whose_jobs_table_is_dropped_says_so_without_spinning_and_resumes_after_init(
    qdb: QueueDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    app = qdb.app()
    done: list[int] = []

    @app.task(name="chaos.mark")
    def mark(n: int) -> None:
        done.append(n)

    running = qdb.start(app, poll=0.5)
    mark.enqueue({"n": 1})
    wait_until(lambda: done == [1], timeout=10, what="the first job")
    caplog.set_level(logging.WARNING, logger="dibs")
    drop_jobs_table(qdb.engine)
    wall, cpu = time.monotonic(), time.process_time()
    time.sleep(2.0)
    wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    assert cpu < 0.5 * wall, f"the worker burnt {cpu:.2f} s of CPU in {wall:.2f} s while the table was gone"
    assert running.thread.is_alive()
    told = [record.getMessage() for record in caplog.records if "run `dibs --db URL init" in record.getMessage()]
    assert told, [record.getMessage() for record in caplog.records]
    assert all("lacks the dibs table dibs_jobs" in message for message in told), told
    # Said at each try, but the tries back off to the poll interval: no flood.
    assert len(told) < 20, told

    assert app.init() == []
    assert "dibs_jobs" in table_names(qdb.engine)
    later = [mark.enqueue({"n": n}).id for n in (2, 3, 4)]
    wait_until(lambda: sorted(done) == [1, 2, 3, 4], timeout=15, what="the jobs enqueued after dibs init")
    wait_until(lambda: {app.get(job_id).status for job_id in later} == {"succeeded"}, timeout=10)


def test_a_success_whose_jobs_table_was_dropped_is_not_written_to_the_table_made_again(
    qdb: QueueDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    app = qdb.app()
    release = threading.Event()
    done: list[int] = []

    @app.task(name="chaos.hold")
    def hold(n: int) -> None:
        release.wait(20)
        done.append(n)

    running = qdb.start(app, poll=0.5)
    hold.enqueue({"n": 1})
    wait_until(lambda: job_rows(qdb.engine)[0].status == "running", timeout=10, what="the first job running")
    caplog.set_level(logging.WARNING, logger="dibs")
    drop_jobs_table(qdb.engine)
    release.set()
    # Its row is gone: kept and written again later, the success would mark the table's new job of the same
    # id and token succeeded without running it.
    wait_until(
        lambda: any("the successes of 1 jobs were not recorded" in r.getMessage() for r in caplog.records),
        timeout=15,
        what="the worker giving up the success of a dropped row",
    )
    assert app.init() == []
    release.clear()
    later = hold.enqueue({"n": 2})
    assert later.id == 1
    release.set()
    wait_until(lambda: done == [1, 2], timeout=15, what="the job of the table made again")
    wait_until(lambda: app.get(later.id).status == "succeeded", timeout=15, what="its success written")
    assert running.worker.stats.lost == 1
