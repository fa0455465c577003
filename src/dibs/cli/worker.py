"""``dibs worker``: run a worker for an app's tasks."""

from __future__ import annotations

import logging
import os
import sys
from datetime import timedelta

import click

from dibs.cli.shared import load_app, run


@click.command(help="Run a worker for the tasks of APP (module:attribute) until SIGTERM or SIGINT.")
@click.argument("app_spec", metavar="APP")
@click.option("--queues", "-q", default=None, help="Comma-separated queues (default: all of the app's).")
@click.option("--tags", default="", help="Comma-separated version/capability tags this worker has.")
@click.option("--concurrency", "-c", default=10, show_default=True, help="Jobs run at once.")
@click.option("--batch", default=None, type=int, help="Jobs claimed per round trip (default: 2 x concurrency).")
@click.option("--lease", default=30.0, show_default=True, help="Seconds a claim is held (renewed by heartbeats).")
@click.option("--grace", default=30.0, show_default=True, help="Seconds running jobs get to finish at shutdown.")
@click.option("--retention", default=None, type=float, help="Purge finished jobs older than this many hours.")
@click.option("--metrics-port", default=None, type=int, help="Serve Prometheus metrics on this port.")
@click.option(
    "--connections",
    default=None,
    type=click.IntRange(1, 2),
    help="Database connections: 2 lets a claim run while successes are written, 1 has them take turns "
    "(spares a database short of CPU). Default: 2, 1 on SQLite.",
)
@click.option("--burst", is_flag=True, help="Exit when no job is queued, scheduled or running.")
def worker(
    app_spec: str,
    queues: str | None,
    tags: str,
    concurrency: int,
    batch: int | None,
    lease: float,
    grace: float,
    retention: float | None,
    metrics_port: int | None,
    connections: int | None,
    burst: bool,
) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = load_app(app_spec)
    runner = run(
        lambda: app.worker(
            queues=None if queues is None else [q for q in queues.split(",") if q],
            tags=[t for t in tags.split(",") if t],
            concurrency=concurrency,
            batch=batch,
            lease=lease,
            grace=grace,
            retention=None if retention is None else timedelta(hours=retention),
            metrics_port=metrics_port,
            connections=connections,
            burst=burst,
            # This process runs the worker and nothing else.
            tune_gc=True,
        )
    )
    stats = run(runner.run)
    click.echo(
        f"worker stopped: {stats.succeeded} succeeded, {stats.retried} retried, {stats.dead} dead, "
        f"{stats.cancelled} cancelled, {stats.released} released"
    )
    if runner.abandoned:
        # Their threads cannot be stopped and their leases are no longer renewed: ending the process
        # now stops them, as a crash would, so that they do not run on beside a second run elsewhere.
        click.echo(
            f"{runner.abandoned} sync job(s) were still running past the grace period; they stop with "
            "this process and run again once their leases expire",
            err=True,
        )
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
