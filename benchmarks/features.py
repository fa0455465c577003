"""What results and dependencies cost per job, beside plain jobs, on PostgreSQL and SQLite.

Three kinds of job, ``--jobs`` of each (default 3,000), each kind in a fresh ``dibs_jobs`` table:

* ``plain``: tasks that return None (their successes are written in batches);
* ``results``: tasks that return a small JSON object (each success written with its result);
* ``chain3``: chains of three steps returning None (``app.chain``), ``--jobs`` jobs in all: every step
  after the first waits, and is counted down and queued when the one before it succeeds.

Measured per kind: the enqueue (``enqueue_many`` of all the jobs, or one ``app.chain`` call per chain)
and the drain (one burst worker, ``--concurrency`` runners), each in microseconds per job. The kinds
take turns within each of ``--repeats`` rounds (default 3), and the median of the rounds is reported.

    python -m benchmarks.features
    python -m benchmarks.features --backends sqlite --jobs 1000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import dibs

POSTGRES = os.environ.get("DIBS_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
KINDS = ("plain", "results", "chain3")


def _postgres_url() -> tuple[str, Callable[[], None]]:
    """A fresh database on the PostgreSQL server, and how to drop it."""
    admin = sa.create_engine(POSTGRES, isolation_level="AUTOCOMMIT")
    name = f"dibs_features_{os.getpid()}"
    with admin.connect() as conn:
        conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name}"))
        conn.execute(sa.text(f"CREATE DATABASE {name}"))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()

    return sa.make_url(POSTGRES).set(database=name).render_as_string(hide_password=False), drop


def _app(url: str) -> dibs.App:
    engine = dibs.create_engine(url)
    dibs.schema.metadata.drop_all(engine)
    app = dibs.App(engine)
    app.init()

    @app.task(name="bench.plain")
    def plain(n: int) -> None:
        return None

    @app.task(name="bench.result")
    def result(n: int) -> dict[str, int]:
        return {"n": n, "double": 2 * n}

    return app


def _one(url: str, kind: str, jobs: int, concurrency: int) -> tuple[float, float]:
    """Enqueue and drain ``jobs`` jobs of ``kind``; microseconds per job for each."""
    app = _app(url)
    try:
        began = time.perf_counter()
        if kind == "chain3":
            for n in range(jobs // 3):
                app.chain(*(dibs.Step("bench.plain", {"n": n}) for _ in range(3)))
        else:
            task = "bench.plain" if kind == "plain" else "bench.result"
            app.enqueue_many(task, [{"n": n} for n in range(jobs)])
        enqueued = time.perf_counter()
        stats = app.worker(burst=True, concurrency=concurrency, handle_signals=False, poll=0.05).run()
        drained = time.perf_counter()
        expected = jobs // 3 * 3 if kind == "chain3" else jobs
        if stats.succeeded != expected:
            raise RuntimeError(f"{kind}: {stats.succeeded} of {expected} jobs succeeded")
        return (enqueued - began) / expected * 1e6, (drained - enqueued) / expected * 1e6
    finally:
        app.engine.dispose()


def benchmark(backends: Sequence[str], jobs: int, repeats: int, concurrency: int) -> dict[str, Any]:
    """Run the kinds on each backend; the median microseconds per job of each, as a JSON-able dict."""
    report: dict[str, Any] = {"jobs": jobs, "repeats": repeats, "concurrency": concurrency, "backends": {}}
    for backend in backends:
        cleanup: Callable[[], None] = lambda: None  # noqa: E731
        with tempfile.TemporaryDirectory() as directory:
            if backend == "postgresql":
                url, cleanup = _postgres_url()
            else:
                url = f"sqlite:///{Path(directory) / 'features.sqlite'}"
            try:
                runs: dict[str, list[tuple[float, float]]] = {kind: [] for kind in KINDS}
                for round_number in range(repeats):
                    order = KINDS[round_number % len(KINDS) :] + KINDS[: round_number % len(KINDS)]
                    for kind in order:
                        runs[kind].append(_one(url, kind, jobs, concurrency))
            finally:
                cleanup()
        report["backends"][backend] = {
            kind: {
                "enqueue_us_per_job": round(statistics.median(run[0] for run in timings), 1),
                "drain_us_per_job": round(statistics.median(run[1] for run in timings), 1),
            }
            for kind, timings in runs.items()
        }
    return report


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The command line: parse ``argv``, run, print the table and the JSON; returns the report."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.features", description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="postgresql,sqlite")
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=10)
    options = parser.parse_args(argv)
    report = benchmark(options.backends.split(","), options.jobs, options.repeats, options.concurrency)
    for backend, kinds in report["backends"].items():
        print(f"{backend}: microseconds per job (median of {options.repeats})")
        plain = kinds["plain"]
        for kind, numbers in kinds.items():
            extra = numbers["drain_us_per_job"] - plain["drain_us_per_job"]
            print(
                f"  {kind:<8} enqueue {numbers['enqueue_us_per_job']:>8.1f}   drain {numbers['drain_us_per_job']:>8.1f}"
                f"   drain beyond plain {extra:>+8.1f}"
            )
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    run()
