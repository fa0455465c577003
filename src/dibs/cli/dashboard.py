"""``dibs dashboard``: serve the web dashboard of the database (the ``dashboard`` extra)."""

from __future__ import annotations

import click

from dibs.cli.shared import fail, open_app
from dibs.engine import shown_url


@click.command(
    help="Serve the web dashboard of the database (needs the dashboard extra). It binds to loopback "
    "unless --host says otherwise; give --token or --basic-auth before exposing it."
)
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="The port to listen on.")
@click.option("--read-only", is_flag=True, help="Show everything, change nothing: no action is offered or accepted.")
@click.option("--token", default=None, help="Let in only requests with this token (open /?token=TOKEN once).")
@click.option("--basic-auth", default=None, metavar="USER:PASSWORD", help="Let in only these basic-auth credentials.")
@click.option("--root-path", default="", help="The path a reverse proxy serves it under (for example /dibs).")
@click.pass_context
def dashboard(
    ctx: click.Context,
    host: str,
    port: int,
    read_only: bool,
    token: str | None,
    basic_auth: str | None,
    root_path: str,
) -> None:
    try:
        import uvicorn

        import dibs.dashboard as web
    except ImportError:
        fail("the dashboard needs its extra: pip install 'dibs-sql[dashboard]'")
    if token and basic_auth:
        fail("give --token or --basic-auth, not both")
    auth = None
    if token:
        auth = web.token_auth(token)
    elif basic_auth:
        user, colon, password = basic_auth.partition(":")
        if not colon or not user or not password:
            fail("--basic-auth takes USER:PASSWORD")
        auth = web.basic_auth(user, password)
    app = open_app(ctx)
    where = shown_url(app.engine.url)
    click.echo(f"dibs dashboard of {where} on http://{host}:{port}/{' (read-only)' if read_only else ''}")
    served = web.create_app(app, read_only=read_only, auth=auth)
    uvicorn.run(served, host=host, port=port, root_path=root_path, log_level="warning")
