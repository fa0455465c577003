"""What the commands share: loading the user's app, opening the app or outbox on --db, and turning errors
into a clear message."""

from __future__ import annotations

import importlib
import os
import shutil
import sys
from typing import Any

import click
import sqlalchemy as sa
from rich.console import Console

import dibs
from dibs.outbox import Outbox
from dibs.queue.app import App
from dibs.schema import require_current


def fail(message: str) -> None:
    raise click.ClickException(message)


def load_app(spec: str) -> App:
    module_name, _, attribute = spec.partition(":")
    if not module_name:
        fail(f"APP must look like module:attribute (for example myproject.tasks:app), got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        fail(f"cannot import {module_name!r} ({exc}); run dibs from your project's directory or fix APP")
    except dibs.DibsError as exc:  # an App made as the module loads, on a URL that can never work
        fail(str(exc))
    if not attribute:
        found = [value for value in vars(module).values() if isinstance(value, App)]
        if len(found) != 1:
            fail(f"{module_name!r} has {len(found)} dibs.App objects; name one as {module_name}:attribute")
        return found[0]
    app = getattr(module, attribute, None)
    if not isinstance(app, App):
        fail(f"{spec!r} is not a dibs.App (it is {type(app).__name__})")
    return app  # type: ignore[return-value]


def console() -> Console:
    """Tables stay readable when piped: at least 120 columns wide."""
    return Console(width=max(shutil.get_terminal_size().columns, 120))


def open_app(ctx: click.Context) -> App:
    """The app on --db, for commands that read or change jobs: its tables must exist."""
    app: App = run(lambda: App(ctx.obj["db"]))
    run(lambda: require_current(app.engine))
    return app


def open_outbox(ctx: click.Context, **options: Any) -> Outbox:
    """The outbox on --db, for commands that read or change events: its table must exist."""
    outbox: Outbox = run(lambda: Outbox(ctx.obj["db"], **options))
    run(lambda: require_current(outbox.engine))
    return outbox


def run(action: Any) -> Any:
    """Run an action, turning dibs and database errors into a clear message and exit status 1."""
    try:
        return action()
    except dibs.DibsError as exc:
        raise click.ClickException(str(exc)) from exc
    except sa.exc.DBAPIError as exc:
        first = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else str(exc)
        raise click.ClickException(
            f"the database refused or could not be reached: {first}; check --db (or $DIBS_DATABASE_URL) "
            "and that the database server is running"
        ) from exc
