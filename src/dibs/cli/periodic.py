"""``dibs periodic``: list, pause and resume periodic schedules."""

from __future__ import annotations

from collections.abc import Sequence

import click
from rich.table import Table

from dibs.cli.shared import add_plain_row, console, open_app, run
from dibs.queue.periodic import PeriodicStatus


@click.group(help="List, pause and resume periodic schedules.")
def periodic() -> None:
    pass


@periodic.command("list", help="Every schedule recorded in the database: its next and last slot, and whether paused.")
@click.pass_context
def list_schedules(ctx: click.Context) -> None:
    schedules = run(open_app(ctx).periodic_status)
    if not schedules:
        click.echo("no periodic jobs recorded yet (a worker records its app's schedules as it starts)")
        return
    console().print(schedules_table(schedules))


def schedules_table(schedules: Sequence[PeriodicStatus], title: str | None = None) -> Table:
    """The schedules as a table, one row each."""
    table = Table(title=title)
    for column in ("name", "task", "schedule", "next slot (UTC)", "last slot (UTC)", "last job", "paused"):
        table.add_column(column)
    for row in schedules:
        add_plain_row(
            table,
            row.name,
            row.task,
            row.schedule,
            row.next_slot_at.strftime("%Y-%m-%d %H:%M:%S"),
            "-" if row.last_slot_at is None else row.last_slot_at.strftime("%Y-%m-%d %H:%M:%S"),
            "-" if row.last_job_id is None else str(row.last_job_id),
            "yes" if row.paused else "no",
        )
    return table


@periodic.command(help="Stop schedule NAME from enqueueing jobs; its slots pass until it is resumed.")
@click.argument("name")
@click.pass_context
def pause(ctx: click.Context, name: str) -> None:
    run(lambda: open_app(ctx).pause_periodic(name))
    click.echo(f"periodic job {name}: paused")


@periodic.command(help="Let schedule NAME enqueue jobs again from its next slot; passed slots are not made up for.")
@click.argument("name")
@click.pass_context
def resume(ctx: click.Context, name: str) -> None:
    run(lambda: open_app(ctx).resume_periodic(name))
    click.echo(f"periodic job {name}: resumed")
