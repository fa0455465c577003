"""``dibs jobs``: list, retry, cancel and purge jobs."""

from __future__ import annotations

from datetime import timedelta

import click
from rich.table import Table

from dibs.cli.shared import console, open_app, run
from dibs.schema import FINISHED, STATES


@click.group(help="List, retry, cancel and purge jobs.")
def jobs() -> None:
    pass


@jobs.command("list", help="Jobs, newest first.")
@click.option("--status", "states", multiple=True, type=click.Choice(STATES), help="Only jobs in this state.")
@click.option("--queue", default=None)
@click.option("--task", default=None)
@click.option("--limit", default=50, show_default=True)
@click.pass_context
def list_jobs(ctx: click.Context, states: tuple[str, ...], queue: str | None, task: str | None, limit: int) -> None:
    found = run(lambda: open_app(ctx).jobs(status=list(states) or None, queue=queue, task=task, limit=limit))
    table = Table()
    for column in ("id", "task", "queue", "status", "attempts", "run at", "last error"):
        table.add_column(column)
    for job in found:
        error = (job.last_error or "").splitlines()[0] if job.last_error else ""
        table.add_row(
            str(job.id),
            job.task,
            job.queue,
            job.status,
            f"{job.attempts}/{job.max_attempts}",
            job.run_at.strftime("%Y-%m-%d %H:%M:%S"),
            error[:80],
        )
    console().print(table)


@jobs.command(help="Queue dead or cancelled jobs again.")
@click.argument("ids", nargs=-1, type=int, required=True)
@click.pass_context
def retry(ctx: click.Context, ids: tuple[int, ...]) -> None:
    app = open_app(ctx)
    for job_id in ids:
        job = run(lambda job_id=job_id: app.retry(job_id))
        click.echo(f"job {job.id}: {job.status}")


@jobs.command(help="Cancel jobs: waiting ones at once, running ones are asked to stop.")
@click.argument("ids", nargs=-1, type=int, required=True)
@click.pass_context
def cancel(ctx: click.Context, ids: tuple[int, ...]) -> None:
    app = open_app(ctx)
    for job_id in ids:
        job = run(lambda job_id=job_id: app.cancel(job_id))
        asked = " (asked to stop)" if job.cancel_requested and job.status == "running" else ""
        click.echo(f"job {job.id}: {job.status}{asked}")


@jobs.command(help="Delete finished jobs older than --older-than hours.")
@click.option("--older-than", default=0.0, show_default=True, help="Hours since they finished.")
@click.option("--status", "states", multiple=True, type=click.Choice(FINISHED), help="Default: all finished.")
@click.pass_context
def purge(ctx: click.Context, older_than: float, states: tuple[str, ...]) -> None:
    removed = run(
        lambda: open_app(ctx).purge(older_than=timedelta(hours=older_than), statuses=list(states) or FINISHED)
    )
    click.echo(f"purged {removed:,} finished jobs")
