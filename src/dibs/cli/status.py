"""``dibs status``: jobs per queue and state, live workers, jobs none of them can take, periodic jobs."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from dibs.cli.periodic import schedules_table
from dibs.cli.shared import add_plain_row
from dibs.cli.shared import console as _console
from dibs.cli.shared import open_app as _app
from dibs.cli.shared import run as _run
from dibs.queue.app import App
from dibs.schema import STATES


@click.command(help="Jobs per queue and state, the oldest runnable job's wait, throughput, periodic jobs.")
@click.pass_context
def status(ctx: click.Context) -> None:
    statuses = _run(_app(ctx).status)
    table = Table(title="dibs queues")
    table.add_column("queue")
    for state in STATES:
        table.add_column(state, justify="right")
    table.add_column("oldest ready", justify="right")
    table.add_column("finished/s (1 min)", justify="right")
    for row in statuses:
        oldest = "-" if row.oldest_ready_seconds is None else f"{row.oldest_ready_seconds:.1f}s"
        add_plain_row(
            table, row.queue, *(f"{row.counts[state]:,}" for state in STATES), oldest, f"{row.finished_per_second:.1f}"
        )
    console = _console()
    console.print(table if statuses else "no jobs yet")
    _print_workers(console, _app(ctx))
    schedules = _run(_app(ctx).periodic_status)
    if schedules:
        console.print(schedules_table(schedules, title="periodic jobs"))


def _print_workers(console: Console, app: App) -> None:
    """The live workers, and a warning for the queued jobs none of them can take."""
    workers = _run(app.workers)
    if workers:
        table = Table(title="live workers")
        for column in ("name", "host", "pid", "queues", "concurrency", "last heartbeat"):
            table.add_column(column, justify="right" if column in ("pid", "concurrency") else "left")
        for worker in workers:
            add_plain_row(
                table,
                worker.name,
                worker.host,
                str(worker.pid),
                ",".join(worker.queues),
                str(worker.concurrency),
                f"{worker.heartbeat_age_seconds:.1f}s ago",
            )
        console.print(table)
    else:
        console.print("no live workers")
    stranded = _run(app.stranded_jobs)
    if stranded:
        warning = Table(title="[bold yellow]warning: queued jobs no live worker can take[/]")
        for column in ("queue", "task", "tag", "jobs", "oldest", "why"):
            warning.add_column(column, justify="right" if column in ("jobs", "oldest") else "left")
        for group in stranded:
            add_plain_row(
                warning,
                group.queue,
                group.task,
                group.tag or "-",
                f"{group.count:,}",
                f"{group.oldest_seconds:.1f}s",
                group.reason,
            )
        console.print(warning)
