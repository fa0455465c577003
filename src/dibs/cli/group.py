"""The ``dibs`` group (its options, --version, -h) and the small commands of its own, init and demo; the
other commands are in modules named after them."""

from __future__ import annotations

import os

import click

import dibs
from dibs.cli.dashboard import dashboard
from dibs.cli.enqueue import enqueue
from dibs.cli.jobs import jobs
from dibs.cli.outbox import outbox
from dibs.cli.periodic import periodic
from dibs.cli.queues import queues
from dibs.cli.shared import DibsGroup, run
from dibs.cli.sql import sql
from dibs.cli.status import status
from dibs.cli.worker import worker
from dibs.engine import database_url, shown_url
from dibs.queue.app import App
from dibs.schema import missing_tables

HELP = """Create the dibs tables, run workers, enqueue, inspect and manage jobs, relay and inspect outbox
events, run the demo.

The database comes from --db, else $DIBS_DATABASE_URL, else the SQLite file dibs.sqlite. APP is where an
app lives, as module:attribute (myproject.tasks:app); the current directory is on the import path.

Run dibs COMMAND -h for the options of a command.
"""


@click.group(cls=DibsGroup, help=HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(dibs.__version__, "--version", "-V", prog_name="dibs", message="%(prog)s %(version)s")
@click.option(
    "--db",
    envvar="DIBS_DATABASE_URL",
    default=None,
    metavar="URL",
    help="Database URL, such as postgresql+psycopg://user@host/app [env: DIBS_DATABASE_URL; "
    "default: sqlite:///dibs.sqlite].",
)
@click.pass_context
def command(ctx: click.Context, db: str | None) -> None:
    ctx.ensure_object(dict)
    ctx.obj["db"] = database_url(db)
    # Apps the user's modules create without a URL use the same database.
    os.environ["DIBS_DATABASE_URL"] = ctx.obj["db"]


@command.command(help="Create the dibs tables, or upgrade them to this version of dibs.")
@click.pass_context
def init(ctx: click.Context) -> None:
    app: App = run(lambda: App(ctx.obj["db"]))
    gone = run(lambda: missing_tables(app.engine))
    applied = run(app.init)
    where = shown_url(app.engine.url)
    if applied:
        click.echo(f"applied migration(s) {', '.join(map(str, applied))} to {where}")
    if gone:
        click.echo(f"created the missing table{'s' if len(gone) > 1 else ''} {', '.join(gone)} in {where} again")
    if not applied and not gone:
        click.echo(f"{where} is up to date")


@command.command(help="Drain a realistic mixed workload with worker processes on SQLite, live.")
@click.option("--jobs", "count", default=2000, show_default=True, help="About how many jobs.")
@click.option("--workers", default=3, show_default=True, help="Worker processes.")
@click.option("--file", "path", default=None, help="SQLite file (default: dibs-demo.sqlite, recreated).")
@click.option("--no-kill", is_flag=True, help="Do not kill a worker mid-run.")
def demo(count: int, workers: int, path: str | None, no_kill: bool) -> None:
    from dibs.demo import run_demo

    if not run_demo(path, count, workers, not no_kill):
        raise SystemExit(1)


for subcommand in (worker, enqueue, status, jobs, queues, periodic, outbox, dashboard, sql):
    command.add_command(subcommand)
