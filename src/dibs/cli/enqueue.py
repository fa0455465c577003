"""``dibs enqueue``: enqueue one job of an app's task."""

from __future__ import annotations

import json
from typing import Any

import click

from dibs.cli.shared import fail, load_app, run


@click.command(help="Enqueue a job of TASK from APP, with ARGS as a JSON object.")
@click.argument("app_spec", metavar="APP")
@click.argument("task")
@click.argument("args", default="{}")
@click.option("--queue", default=None)
@click.option("--priority", default=None, type=int)
@click.option("--delay", default=None, type=float, help="Seconds from now.")
@click.option("--max-attempts", default=None, type=int)
@click.option("--dedupe-key", default=None)
@click.option("--ordering-key", default=None)
def enqueue(app_spec: str, task: str, args: str, **options: Any) -> None:
    app = load_app(app_spec)
    try:
        values = json.loads(args)
    except json.JSONDecodeError as exc:
        fail(f"ARGS must be a JSON object such as '{{\"order_id\": 7}}': {exc}")
    chosen = {name: value for name, value in options.items() if value is not None}
    job = run(lambda: app.enqueue(task, values, **chosen))
    click.echo(f"enqueued job {job.id} ({job.task}) on queue {job.queue}: {job.status}")
