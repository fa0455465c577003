"""``dibs enqueue``: enqueue one job of an app's task."""

from __future__ import annotations

import json
from typing import Any

import click
import sqlalchemy as sa

from dibs import App
from dibs._checks import checked_text
from dibs.cli.shared import fail, load_app, run
from dibs.queue.enqueue import KEY_LIMIT
from dibs.schema import LIVE, jobs
from dibs.schema.status import tables_checked


@click.command(
    help="Enqueue a job of TASK (a task name, as the app registers it) from APP (module:attribute), with ARGS "
    """as a JSON object of the task's arguments (default: {}), for example '{"order_id": 7}'. """
    "Options left out take the task's defaults."
)
@click.argument("app_spec", metavar="APP")
@click.argument("task")
@click.argument("args", default="{}")
@click.option("--queue", default=None, help="Put the job on this queue instead of the task's.")
@click.option("--priority", default=None, type=int, help="Higher runs first.")
@click.option("--delay", default=None, type=float, help="Run it no sooner than this many seconds from now.")
@click.option("--max-attempts", default=None, type=int, help="Runs at most, retries included.")
@click.option("--dedupe-key", default=None, help="While a live job has this key, return it instead of a new one.")
@click.option("--ordering-key", default=None, help="Jobs with the same key run one at a time, in enqueue order.")
def enqueue(app_spec: str, task: str, args: str, **options: Any) -> None:
    app = load_app(app_spec)
    try:
        values = json.loads(args)
    except json.JSONDecodeError as exc:
        fail(f"ARGS must be a JSON object such as '{{\"order_id\": 7}}': {exc}")
    chosen = {name: value for name, value in options.items() if value is not None}
    found = run(lambda: app.task_named(task))  # its full name, or its function's when that is unique
    key = chosen.get("dedupe_key")
    held = None if key is None else run(lambda: _holder(app, checked_text(key, "dedupe_key", KEY_LIMIT)))
    job = run(lambda: app.enqueue(found, values, **chosen))
    if held == job.id:
        click.echo(f"job {job.id} ({job.task}) already holds dedupe key {key!r}: nothing enqueued; it is {job.status}")
        return
    click.echo(f"enqueued job {job.id} ({job.task}) on queue {job.queue}: {job.status}")


def _holder(app: App, key: str) -> int | None:
    """The live job that holds dedupe key ``key``, if one does: the enqueue returns it instead of a new one."""
    with tables_checked(app.engine), app.engine.connect() as conn:
        found = conn.execute(sa.select(jobs.c.id).where(jobs.c.dedupe_key == key, jobs.c.status.in_(LIVE))).first()
    return None if found is None else int(found[0])
