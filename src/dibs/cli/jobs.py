"""``dibs jobs``: list, show, retry, cancel and purge jobs."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from typing import Any

import click
from rich.table import Table

from dibs.cli.shared import (
    ROW_ID,
    add_plain_row,
    all_in,
    confirmed,
    console,
    echo_json,
    echo_record,
    existing,
    open_app,
    purge_age,
    run,
)
from dibs.queue.job import Job
from dibs.schema import CANCELLED, DEAD, FINISHED, STATES


@click.group(help="List, show, retry, cancel and purge jobs.")
def jobs() -> None:
    pass


@jobs.command("list", help="Jobs, newest first.")
@click.option(
    "--status", "states", multiple=True, type=click.Choice(STATES), help="Only jobs in this state; repeat for more."
)
@click.option("--queue", default=None, help="Only the jobs of this queue.")
@click.option("--task", default=None, help="Only the jobs of this task (its full name, as in the list).")
@click.option("--limit", default=50, show_default=True, help="At most this many jobs.")
@click.pass_context
def list_jobs(ctx: click.Context, states: tuple[str, ...], queue: str | None, task: str | None, limit: int) -> None:
    found = run(lambda: open_app(ctx).jobs(status=list(states) or None, queue=queue, task=task, limit=limit))
    table = Table()
    for column in ("id", "task", "queue", "status", "attempts", "run at", "last error"):
        table.add_column(column)
    for job in found:
        error = (job.last_error or "").splitlines()[0] if job.last_error else ""
        add_plain_row(
            table,
            str(job.id),
            job.task,
            job.queue,
            job.status,
            f"{job.attempts}/{job.max_attempts}",
            job.run_at.strftime("%Y-%m-%d %H:%M:%S"),
            error[:80],
        )
    console().print(table)


@jobs.command(help="Everything about job ID: its arguments, attempts, times, lease, and its last error in full.")
@click.argument("job_id", metavar="ID", type=ROW_ID)
@click.option("--json", "as_json", is_flag=True, help="Print the job as one JSON object.")
@click.pass_context
def show(ctx: click.Context, job_id: int, as_json: bool) -> None:
    job: Job = run(lambda: open_app(ctx).get(job_id))
    if as_json:
        echo_json(dataclasses.asdict(job))
        return
    fields: list[tuple[str, Any]] = [
        ("task", job.task),
        ("queue", job.queue),
        ("status", job.status + (" (cancel requested)" if job.cancel_requested else "")),
        ("arguments", json.dumps(job.args)),
        ("attempts", f"{job.attempts} of {job.max_attempts}"),
        ("progress", None if job.progress is None else f"{job.progress:.0%}"),
        ("progress message", job.progress_message),
        ("priority", job.priority),
        ("tag", job.tag),
        ("dedupe key", job.dedupe_key),
        ("ordering key", job.ordering_key),
        ("enqueued at", job.enqueued_at),
        ("run at", job.run_at),
        ("started at", job.started_at),
        ("finished at", job.finished_at),
        ("lease owner", job.lease_owner),
        ("lease expires at", job.lease_expires_at),
    ]
    echo_record(f"job {job.id}", fields, [("result", job.result_json), ("last error", job.last_error)])


@jobs.command(
    help="Queue the dead or cancelled jobs IDS again, their attempts counted from zero (a job that waited for "
    "others waits again for those not finished)."
)
@click.argument("ids", metavar="IDS...", nargs=-1, type=ROW_ID, required=True)
@click.pass_context
def retry(ctx: click.Context, ids: tuple[int, ...]) -> None:
    app = open_app(ctx)
    # Each once, oldest first: a job's parents are older than it, so a workflow retried whole runs in order.
    ids = tuple(sorted(set(ids)))
    all_in(existing(ids, app.get), (DEAD, CANCELLED), "retried", "job")
    for job_id in ids:
        job = run(lambda job_id=job_id: app.retry(job_id))
        click.echo(f"job {job.id}: {job.status}")


@jobs.command(help="Cancel the jobs IDS: waiting ones at once, running ones are asked to stop.")
@click.argument("ids", metavar="IDS...", nargs=-1, type=ROW_ID, required=True)
@click.pass_context
def cancel(ctx: click.Context, ids: tuple[int, ...]) -> None:
    app = open_app(ctx)
    existing(ids, app.get)
    for job_id in ids:
        job = run(lambda job_id=job_id: app.cancel(job_id))
        asked = " (asked to stop)" if job.cancel_requested and job.status == "running" else ""
        click.echo(f"job {job.id}: {job.status}{asked}")


@jobs.command(
    help="Delete finished jobs: those that finished more than --older-than hours ago, or --all of them. "
    "Succeeded and cancelled jobs are deleted; dead jobs are kept unless --status dead is given. It says how "
    "many of each state it will delete and asks first (--yes does not ask)."
)
@click.option("--older-than", type=click.FloatRange(min=0), default=None, help="Hours since they finished.")
@click.option("--all", "everything", is_flag=True, help="Every finished job, however recent.")
@click.option(
    "--status",
    "states",
    multiple=True,
    type=click.Choice(FINISHED),
    help="Only jobs in this state; repeat for more (default: succeeded and cancelled, never dead).",
)
@click.option("--yes", "-y", is_flag=True, help="Delete without asking (for scripts).")
@click.pass_context
def purge(ctx: click.Context, older_than: float | None, everything: bool, states: tuple[str, ...], yes: bool) -> None:
    age = purge_age(older_than, everything)
    chosen = [state for state in FINISHED if state in states] if states else [s for s in FINISHED if s != DEAD]
    app = open_app(ctx)
    counts = run(lambda: app.purgeable(older_than=age, statuses=chosen))
    scope = "finished" if age == timedelta(0) else f"finished more than {older_than:g} hours ago"
    kept = "" if DEAD in chosen else " (dead jobs are kept: add --status dead to delete them too)"
    if not sum(counts.values()):
        click.echo(f"no {' or '.join(chosen)} jobs {scope}: nothing to delete{kept}")
        return
    if not confirmed(f"this deletes {_per_state(counts, chosen)} jobs {scope}{kept}", yes):
        return
    removed = {state: run(lambda state=state: app.purge(older_than=age, statuses=[state])) for state in chosen}
    click.echo(f"deleted {_per_state(removed, chosen)} jobs")


def _per_state(counts: dict[str, int], states: list[str]) -> str:
    return ", ".join(f"{counts.get(state, 0):,} {state}" for state in states)
