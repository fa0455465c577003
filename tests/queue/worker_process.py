"""A worker in a process of its own, for the crash and shutdown tests.

    python -m tests.queue.worker_process URL [--concurrency N] [--batch N] [--lease S] [--grace S]

Its one task, ``tests.nap``, logs ``started`` and ``finished`` rows (with its job id) in the test table
``dibs_test_runs`` around a sleep, so the test can tell which jobs ran, and which were cut short.
"""

from __future__ import annotations

import argparse
import time

import dibs
from tests.queue.support import log_run


def build_app(url: str) -> dibs.App:
    app = dibs.App(dibs.create_engine(url))

    @app.task(name="tests.nap", max_attempts=5)
    def nap(seconds: float, context: dibs.JobContext) -> None:
        log_run(app.engine, context.job_id, "started")
        time.sleep(seconds)
        log_run(app.engine, context.job_id, "finished")

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--lease", type=float, default=1.5)
    parser.add_argument("--grace", type=float, default=10.0)
    options = parser.parse_args()
    app = build_app(options.url)
    worker = dibs.Worker(
        app,
        concurrency=options.concurrency,
        batch=options.batch,
        lease=options.lease,
        grace=options.grace,
        poll=0.05,
        upkeep_every=0.1,
    )
    try:
        worker.run()
    finally:
        app.engine.dispose()


if __name__ == "__main__":
    main()
