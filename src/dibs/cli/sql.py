"""``dibs sql``: the SQL of the migrations, for database administrators who apply schema changes by hand."""

from __future__ import annotations

import click
import sqlalchemy as sa

from dibs.cli.shared import run
from dibs.schema import LATEST
from dibs.schema.script import DIALECTS, migration_sql


@click.command(
    help="Print the SQL of the migrations, as dibs init would run them, to apply by hand. Without --dialect, "
    "the SQL suits the database of --db (nothing connects to it)."
)
@click.option(
    "--dialect",
    type=click.Choice(DIALECTS),
    default=None,
    help="The database to write SQL for [default: that of --db].",
)
@click.option(
    "--from",
    "start",
    type=click.IntRange(0, LATEST),
    default=0,
    show_default=True,
    help="The schema version the database has now (0: no dibs tables; the largest version in dibs_schema).",
)
@click.option(
    "--to", "end", type=click.IntRange(0, LATEST), default=LATEST, show_default=True, help="The version to reach."
)
@click.pass_context
def sql(ctx: click.Context, dialect: str | None, start: int, end: int) -> None:
    chosen = dialect or sa.make_url(ctx.obj["db"]).get_backend_name()
    click.echo(run(lambda: migration_sql(chosen, start, end)), nl=False)
