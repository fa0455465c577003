"""Drain throughput of the job queue: dibs beside pgqueuer and beside the raw-SQL floor; and pickup latency.

A trial enqueues N no-op jobs up front, then 1 or 2 worker processes drain them; they start together on
a barrier, and throughput is N / the time from the barrier to the last process finishing. After every
trial the database is checked: every job must be finished exactly once, or the run stops.

* ``dibs``: ``app.worker(burst=True, concurrency=C, batch=B)``, an async no-op task, on PostgreSQL
  (psycopg), SQLite (a file in a temp dir) and MariaDB (PyMySQL), at several (C, B) settings.
* ``pgqueuer`` (PostgreSQL only, its own database): ``PgQueuer.run(mode=drain)`` on asyncpg and uvloop,
  the setup its docs recommend for throughput, at several batch sizes.
* ``raw``: the floor. A loop on the bare driver of one claim statement of a batch (the shape dibs
  uses) and, on a second connection and thread, one batched, token-fenced completion of the batch
  before (dibs's worker overlaps them the same way), on the same freshly filled ``dibs_jobs`` table, at
  each batch size the dibs settings use.
* ``graphile-worker`` and ``pg-boss`` (PostgreSQL, where Node is installed): their Node drivers in
  ``benchmarks/peers``, each in a database of its own.

Every job carries the same small arguments (``benchmarks.payload``); every kind drains the same N jobs
with two settings; ``--gc`` tunes the garbage collector of every worker process alike, or none.

Trials alternate between kinds within each round so that drift on a noisy machine hits all of them;
medians are reported. Then, on PostgreSQL, enqueue-to-start latency: a producer process enqueues one job
at a time at a fixed rate to a running (not burst) worker that wakes on LISTEN/NOTIFY.

    python -m benchmarks.drain                                  # everything, about ten minutes
    python -m benchmarks.drain --backends sqlite --processes 1 --repeats 5
    python -m benchmarks.drain --backends postgresql --configs 1000x500 --latency-seconds 0
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import dibs
from benchmarks import payload
from benchmarks.drain_kinds import (
    BACKENDS,
    GC_VARIABLE,
    KINDS,
    PEERS,
    RETURNS,
    RETURNS_VARIABLE,
    Trial,
    drain_app,
    drain_process,
    label,
    peer,
    peer_settings,
    returns,
)
from benchmarks.drain_report import report
from benchmarks.latency import LATENCY_WORKER, PRODUCER_RATE, describe_latency, latency
from benchmarks.peers import node

# The servers (the same variables as benchmarks.claim); the run works in databases of its own on them,
# created at the start and dropped at the end, so that it never touches anyone's dibs tables.
POSTGRES_URL = os.environ.get("DIBS_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
MARIADB_URL = os.environ.get("DIBS_BENCH_MARIADB_URL", "mysql+pymysql://root@127.0.0.1:3306/test")
#: Its own database; a name of your own (DIBS_BENCH_DATABASE) keeps two runs on one server apart.
DATABASE = os.environ.get("DIBS_BENCH_DATABASE", "dibs_bench_drain")
#: The N jobs, enqueued once through dibs and copied into dibs_jobs before every trial.
TEMPLATE = "dibs_bench_drain_template"
ENQUEUE_CHUNK = 5_000
#: N, the jobs of every trial of every kind on a backend: enough for a few seconds of the fastest drains.
DEFAULT_JOBS = {"postgresql": 20_000, "sqlite": 20_000, "mariadb": 20_000}
#: A trial drains min(N, JOBS_PER_BATCH x batch) jobs, so that small batches do not take minutes.
JOBS_PER_BATCH = 250
#: The jobs of one chain, with --returns chain.
CHAIN_STEPS = 3
#: Where the results go; a test points it elsewhere so that its tiny runs never join the published ones.
RESULTS = Path(os.environ.get("DIBS_BENCH_RESULTS", Path(__file__).parent / "results"))


def trial_jobs(batch: int, jobs: int) -> int:
    return min(jobs, JOBS_PER_BATCH * batch)


# -- the jobs table, filled once and copied before every trial --------------------------------------


def prepare(backend: str, url: str, jobs: int) -> float:
    """A fresh dibs schema and a template of ``jobs`` jobs enqueued through dibs; returns enqueue jobs/s."""
    app = drain_app(url)
    engine = app.engine
    dibs.schema.metadata.drop_all(engine)
    app.init()
    began = time.perf_counter()
    enqueue_all(app, jobs)
    enqueued = jobs / (time.perf_counter() - began)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {TEMPLATE}")
        conn.exec_driver_sql(f"CREATE TABLE {TEMPLATE} AS SELECT * FROM dibs_jobs")
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {TEMPLATE}_parents")
        conn.exec_driver_sql(f"CREATE TABLE {TEMPLATE}_parents AS SELECT * FROM dibs_job_parents")
    engine.dispose()
    return enqueued


def enqueue_all(app: dibs.App, jobs: int) -> None:
    """``jobs`` jobs, alone or in chains of CHAIN_STEPS (a last, shorter chain if they do not divide)."""
    if returns() != "chain":
        for first in range(0, jobs, ENQUEUE_CHUNK):
            app.enqueue_many("noop", [payload.args(n) for n in range(first, min(first + ENQUEUE_CHUNK, jobs))])
        return
    for first in range(0, jobs, CHAIN_STEPS):
        steps = range(first, min(first + CHAIN_STEPS, jobs))
        app.chain(*(dibs.Step("noop", payload.args(n)) for n in steps))


def refill(backend: str, url: str, jobs: int) -> None:
    """dibs_jobs holds exactly the first ``jobs`` template jobs, all queued (or waiting, in chains),
    statistics fresh."""
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for table in ("dibs_jobs", "dibs_job_parents"):
            conn.exec_driver_sql(f"DELETE FROM {table}" if backend == "sqlite" else f"TRUNCATE TABLE {table}")
    with engine.begin() as conn:
        conn.exec_driver_sql(f"INSERT INTO dibs_jobs SELECT * FROM {TEMPLATE} ORDER BY id LIMIT {jobs}")
        # The links of chains whose jobs were copied (none when the jobs are not chained).
        conn.exec_driver_sql(
            f"INSERT INTO dibs_job_parents SELECT * FROM {TEMPLATE}_parents "
            "WHERE child_id IN (SELECT id FROM dibs_jobs)"
        )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if backend == "postgresql":
            conn.exec_driver_sql("VACUUM ANALYZE dibs_jobs")
        elif backend == "sqlite":
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        else:
            conn.exec_driver_sql("ANALYZE TABLE dibs_jobs").all()
    engine.dispose()


SPAN = {
    "postgresql": "extract(epoch FROM max(finished_at) - min(started_at))",
    "sqlite": "(julianday(max(finished_at)) - julianday(min(started_at))) * 86400",
    "mariadb": "TIMESTAMPDIFF(MICROSECOND, min(started_at), max(finished_at)) / 1e6",
}


def verify(backend: str, url: str, jobs: int, kind: str) -> float:
    """Every job succeeded, each claimed exactly once (raise otherwise); returns the seconds from the first
    claim to the last completion on the database clock."""
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT status, count(*), min(attempts), max(attempts) FROM dibs_jobs GROUP BY status"
        ).all()
        span = conn.exec_driver_sql(f"SELECT {SPAN[backend]} FROM dibs_jobs").scalar_one()
    engine.dispose()
    found = {status: (count, low, high) for status, count, low, high in rows}
    if set(found) != {"succeeded"} or found["succeeded"] != (jobs, 1, 1):
        raise RuntimeError(
            f"{kind} on {backend}: expected {jobs} jobs succeeded after one attempt each, found "
            f"{ {status: f'{count} (attempts {low}..{high})' for status, (count, low, high) in found.items()} }"
        )
    return float(span)


# -- a trial: fill, run the worker processes together, check ------------------------------------


def trial(
    manager: Any,
    kind: str,
    backend: str,
    url: str,
    setting: dict[str, Any],
    processes: int,
    jobs: int,
    database: Any,
) -> Trial:
    """One drain: fill, start ``processes`` workers of ``kind`` together, wait for all, check the result.
    ``database`` is the peer's Database for a peer kind, None for dibs and the floor."""
    if database is not None:
        database.refill(jobs)
        address = database.address()
    else:
        refill(backend, url, jobs)
        address = url
    context = multiprocessing.get_context("spawn")
    start = manager.Barrier(processes + 1)
    with context.Pool(processes) as pool:
        pending = pool.starmap_async(
            drain_process, [(kind, backend, address, setting, f"{kind}-{n}", start) for n in range(processes)]
        )
        start.wait(timeout=120)
        began = time.monotonic()
        results = pending.get(timeout=900)
    seconds = max(end for _, end, _ in results) - began
    done = sum(count for count, _, _ in results)
    if done != jobs:
        raise RuntimeError(f"{kind} {label(kind, setting)} on {backend}: the workers report {done} of {jobs} jobs")
    span = database.verify(jobs) if database is not None else verify(backend, url, jobs, kind)
    return Trial(
        backend,
        kind,
        label(kind, setting),
        setting["batch"],
        processes,
        jobs,
        seconds,
        span,
        [round(end - began, 4) for _, end, _ in results],
        [stats for *_, stats in results],
    )


def urls(tmp: Path, database: str = DATABASE) -> dict[str, str]:
    return {
        "postgresql": sa.make_url(POSTGRES_URL).set(database=database).render_as_string(hide_password=False),
        "sqlite": f"sqlite:///{tmp / 'drain.sqlite'}",
        "mariadb": sa.make_url(MARIADB_URL).set(database=database).render_as_string(hide_password=False),
    }


def own_database(backend: str, create: bool, database: str = DATABASE) -> None:
    """Create (or drop) the run's database on the PostgreSQL or MariaDB server."""
    if backend == "sqlite":
        return
    server = POSTGRES_URL if backend == "postgresql" else MARIADB_URL
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        force = " WITH (FORCE)" if backend == "postgresql" else ""
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {database}{force}")
        if create:
            conn.exec_driver_sql(f"CREATE DATABASE {database}")
    admin.dispose()


# -- the run ---------------------------------------------------------------------------------------


def parse_configs(text: str, poll: float) -> list[dict[str, Any]]:
    """``concurrency x batch`` or ``concurrency x batch x connections``, comma-separated."""
    configs = []
    for item in text.split(","):
        numbers = [int(part) for part in item.lower().split("x")]
        if len(numbers) not in (2, 3):
            raise SystemExit(f"--configs: {item!r} is not concurrency x batch [x connections], as in 2000x1000x1")
        config = {"concurrency": numbers[0], "batch": numbers[1], "poll": poll}
        if len(numbers) == 3:
            config["connections"] = numbers[2]
        configs.append(config)
    return configs


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="jobs per trial (default: 50,000; 25,000 on MariaDB); small batch sizes drain fewer",
    )
    parser.add_argument("--processes", default="1,2,4,8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"of {', '.join(KINDS)}")
    parser.add_argument(
        "--configs",
        default="2000x1000,2000x1000x1",
        help="dibs worker settings, concurrency x batch [x connections] (default: the worker's)",
    )
    parser.add_argument("--gc", action="store_true", help="tune the GC of every worker process alike (freeze)")
    parser.add_argument("--poll", type=float, default=2.0, help="dibs worker poll seconds (its default: 2)")
    parser.add_argument(
        "--returns",
        choices=RETURNS,
        default="none",
        help="what dibs's jobs return: none, a small dict (kept as the result), or a dict in 3-step chains",
    )
    for name in PEERS:
        parser.add_argument(f"--{name}", default=None, help=f"{name} settings (default: its module's SETTINGS)")
    parser.add_argument("--latency-rates", default="1000,5000", help="offered jobs/s; empty skips latency")
    parser.add_argument("--latency-seconds", type=float, default=8.0)
    return parser


def run(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the trials ``argv`` asks for; returns the results (also written to benchmarks/results)."""
    options = arguments().parse_args(argv)
    backends = options.backends.split(",")
    kinds = options.kinds.split(",")
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise SystemExit(f"--kinds: unknown {sorted(unknown)}; known: {', '.join(KINDS)}")
    process_counts = [int(p) for p in options.processes.split(",")]
    configs = parse_configs(options.configs, options.poll)
    absent = node.missing()
    if absent and set(kinds) & set(node.DRIVERS):
        print(f"  note: {absent}", flush=True)
        kinds = [kind for kind in kinds if kind not in node.DRIVERS]
    os.environ[GC_VARIABLE] = "1" if options.gc else "0"  # the spawned workers inherit it
    os.environ[RETURNS_VARIABLE] = options.returns
    if options.returns != "none" and set(kinds) - {"dibs"}:
        raise SystemExit("--returns: only the dibs kind returns values; add --kinds dibs")
    peers = {kind: peer_settings(kind, getattr(options, kind.replace("-", "_"))) for kind in PEERS if kind in kinds}
    rates = [float(rate) for rate in options.latency_rates.split(",") if rate]
    began = time.time()
    load_before = os.getloadavg()

    trials: list[Trial] = []
    enqueue_rates: dict[str, float] = {}
    latencies: list[dict[str, Any]] = []
    manager = multiprocessing.get_context("spawn").Manager()
    with tempfile.TemporaryDirectory() as tmp, manager:
        where = urls(Path(tmp))
        try:
            for backend in backends:
                url = where[backend]
                own_database(backend, create=True)
                total = options.jobs or DEFAULT_JOBS[backend]
                enqueue_rates[backend] = prepare(backend, url, total)
                here = {kind: settings for kind, settings in peers.items() if backend in peer(kind).BACKENDS}
                databases = {kind: peer(kind).Database(backend, url) for kind in here}
                try:
                    for processes in process_counts:
                        for _ in range(options.repeats):
                            for kind, setting in round_plan(kinds, configs, here):
                                jobs = total if kind in PEERS else trial_jobs(setting["batch"], total)
                                result = trial(
                                    manager, kind, backend, url, setting, processes, jobs, databases.get(kind)
                                )
                                trials.append(result)
                                print(f"  {describe(result)}", flush=True)
                finally:
                    for database in databases.values():
                        database.close()
            if "postgresql" in backends:
                for rate in rates:
                    measured = latency(manager, where["postgresql"], rate, options.latency_seconds, LATENCY_WORKER)
                    latencies.append({"kind": "dibs", **measured})
                    print(f"  latency, {describe_latency(latencies[-1])}", flush=True)
                    # The Node peers side by side where one producer process offers the rate, as dibs's does.
                    for kind in ("graphile-worker", "pg-boss"):
                        if kind in kinds and rate <= PRODUCER_RATE:
                            measured = node.latency(kind, POSTGRES_URL, rate, options.latency_seconds)
                            latencies.append(measured)
                            print(f"  latency, {describe_latency(measured)}", flush=True)
        finally:
            for backend in backends:
                own_database(backend, create=False)
    load = {"start": load_before, "end": os.getloadavg()}  # other work on the machine shows here
    return report(trials, enqueue_rates, latencies, vars(options), time.time() - began, load, RESULTS)


def describe(result: Trial) -> str:
    span = result.jobs / result.db_seconds if result.db_seconds == result.db_seconds else float("nan")
    return (
        f"{result.backend:<10} x{result.processes}  {result.kind:<16} {result.setting:<12} {result.jobs:>7,} jobs "
        f"{result.jobs_per_second:>10,.0f} jobs/s, {result.cpu_us_per_job:.0f} us CPU/job  (first claim to last "
        f"completion: {span:,.0f} jobs/s; "
        f"processes done at {', '.join(f'{end:.2f}' for end in result.ends)} s)"
    )


def round_plan(
    kinds: list[str], configs: list[dict[str, Any]], peers: dict[str, list[dict[str, Any]]]
) -> list[tuple[str, dict[str, Any]]]:
    """One round of trials: each dibs setting after the raw floor at its batch size, then the peers."""
    plan: list[tuple[str, dict[str, Any]]] = []
    for config in configs:
        if "raw" in kinds and all(setting["batch"] != config["batch"] for kind, setting in plan if kind == "raw"):
            plan.append(("raw", {"batch": config["batch"]}))
        if "dibs" in kinds:
            plan.append(("dibs", config))
    return plan + [(kind, setting) for kind, settings in peers.items() for setting in settings]


def main(argv: list[str] | None = None) -> None:
    run(argv)


if __name__ == "__main__":
    main()
