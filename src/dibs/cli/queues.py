"""``dibs queues``: list, pause and resume queues."""

from __future__ import annotations

import click
from rich.table import Table

from dibs.cli.shared import add_plain_row, console, open_app, run


@click.group(help="List, pause and resume queues.")
def queues() -> None:
    pass


@queues.command("list", help="Every queue with jobs or paused, its jobs per state, and whether it is paused.")
@click.pass_context
def list_queues(ctx: click.Context) -> None:
    app = open_app(ctx)
    paused = set(run(app.paused))
    counts = {status.queue: status.counts for status in run(app.status)}
    table = Table()
    for column in ("queue", "paused", "queued", "running", "scheduled"):
        table.add_column(column)
    for queue in sorted(paused | set(counts)):
        per_state = counts.get(queue, {})
        add_plain_row(
            table,
            queue,
            "yes" if queue in paused else "no",
            *(f"{per_state.get(state, 0):,}" for state in ("queued", "running", "scheduled")),
        )
    console().print(table)


@queues.command(help="Stop every worker from claiming the jobs of queue NAME; running jobs finish.")
@click.argument("name")
@click.pass_context
def pause(ctx: click.Context, name: str) -> None:
    run(lambda: open_app(ctx).pause(name))
    click.echo(f"queue {name}: paused")


@queues.command(help="Let workers claim the jobs of queue NAME again, at once.")
@click.argument("name")
@click.pass_context
def resume(ctx: click.Context, name: str) -> None:
    run(lambda: open_app(ctx).resume(name))
    click.echo(f"queue {name}: resumed")
