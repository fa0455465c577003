"""``dibs enqueue``: enqueue one job of an app's task."""

from __future__ import annotations

import json
from typing import Any

import click

from dibs.cli.shared import fail, load_app, run


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
    job = run(lambda: app.enqueue(found, values, **chosen))
    click.echo(f"enqueued job {job.id} ({job.task}) on queue {job.queue}: {job.status}")
