"""``dibs worker``: run a worker for an app's tasks."""

from __future__ import annotations

import os
import sys

import click

from dibs.cli.logs import configure, log_format_option
from dibs.cli.shared import hours, load_app, run

HELP = """Run a worker for the tasks of APP (module:attribute) until SIGTERM or SIGINT.

APP's database is the one --db or $DIBS_DATABASE_URL names: an app created with dibs.App() takes it; an app
that names a database of its own must name the same one, or the command refuses to start.

A job whose task raises is retried, after 1, 2, 4, 8... seconds (doubling, at most an hour, give or take
10%), until it has run max_attempts times (5 unless the task or the enqueue sets it), then it is dead, its
error and traceback kept (dibs jobs show ID). Any exception is retried unless the task's retry= names the
ones to retry (dibs.Retry(on=(ConnectionError,))); max_attempts=1 runs a job once.

The first SIGTERM or SIGINT stops claiming, gives back the jobs not started yet, and lets running jobs
finish for up to --grace seconds. A second signal stops waiting for them: async jobs are cancelled and
given back at once; sync jobs cannot be stopped from inside, so the process exits with status 1, which
ends them, and they run again once their leases expire (--lease). Sync jobs still running when the
grace period ends go the same way.
"""


@click.command(help=HELP)
@click.argument("app_spec", metavar="APP")
@click.option("--queues", "-q", default=None, help="Comma-separated queues (default: all of the app's).")
@click.option("--tags", default="", help="Comma-separated version/capability tags this worker has.")
@click.option("--concurrency", "-c", default=10, show_default=True, help="Jobs run at once.")
@click.option(
    "--batch",
    default=None,
    type=int,
    help="Most jobs one claim takes (default: the concurrency); a claim never takes more than the idle runners.",
)
@click.option("--lease", default=30.0, show_default=True, help="Seconds a claim is held (renewed by heartbeats).")
@click.option("--grace", default=30.0, show_default=True, help="Seconds running jobs get to finish at shutdown.")
@click.option(
    "--retention",
    default=None,
    type=float,
    help="Delete finished jobs, dead ones included, that finished more than this many hours ago (default: kept).",
)
@click.option(
    "--metrics-port",
    default=None,
    type=click.IntRange(0, 65535),
    help="Serve Prometheus metrics at http://ADDRESS:PORT/metrics (default: not served).",
)
@click.option(
    "--metrics-address",
    default="127.0.0.1",
    show_default=True,
    help="The address metrics are served on: 127.0.0.1 is this machine only, 0.0.0.0 every network.",
)
@click.option(
    "--connections",
    default=None,
    type=click.IntRange(1, 2),
    help="Database connections: 2 lets a claim run while successes are written, 1 has them take turns "
    "(spares a database short of CPU). Default: 2, 1 on SQLite.",
)
@click.option("--burst", is_flag=True, help="Exit when no job is queued, scheduled or running.")
@log_format_option
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
    metrics_address: str,
    connections: int | None,
    burst: bool,
    log_format: str,
) -> None:
    configure(log_format)
    app = load_app(app_spec)
    runner = run(
        lambda: app.worker(
            queues=None if queues is None else [q for q in queues.split(",") if q],
            tags=[t for t in tags.split(",") if t],
            concurrency=concurrency,
            batch=batch,
            lease=lease,
            grace=grace,
            retention=None if retention is None else hours(retention, "--retention"),
            metrics_port=metrics_port,
            metrics_address=metrics_address,
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
            f"{runner.abandoned} sync job(s) were still running when the worker stopped (past the grace "
            "period, or at a second signal); they stop with this process and run again once their leases expire",
            err=True,
        )
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
