"""What the commands share: the one place their errors become a clear line on stderr, loading the user's
app, and opening the app or outbox on --db."""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any, NoReturn
from urllib.parse import unquote

import click
import sqlalchemy as sa
from click.core import ParameterSource
from rich.console import Console
from rich.table import Table
from rich.text import Text

import dibs
from dibs._checks import LARGEST_ID, checked_seconds
from dibs._errors import InvalidArgument
from dibs.engine import shown_url
from dibs.outbox import Outbox
from dibs.queue.app import App
from dibs.schema import require_current

#: The password in a database URL's user:password@, found without parsing it: a URL too broken to parse
#: is still blanked out.
_PASSWORD = re.compile(r"(?:^|[/\s])[^:/@\s]*:(?P<password>[^@\s/][^@\s]*)@")


class DibsGroup(click.Group):
    """A group whose commands fail with one line on stderr and exit status 1, never a traceback, for every
    error dibs or the database reports; the database password is blanked out of every message."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            message = redacted(exc.message, ctx)
            if message == exc.message:
                raise
            if isinstance(exc, click.UsageError):
                raise click.UsageError(message, exc.ctx) from None
            raise click.ClickException(message) from None
        except (dibs.DibsError, sa.exc.SQLAlchemyError) as exc:
            raise click.ClickException(redacted(explained(exc), ctx)) from exc


def explained(error: Exception) -> str:
    """What a user reads of a dibs or database error: its message, or the driver's first line."""
    if isinstance(error, sa.exc.DBAPIError):
        first = str(error.orig).strip().splitlines()[0] if error.orig is not None else str(error)
        return (
            f"the database refused or could not be reached: {first}; check --db (or $DIBS_DATABASE_URL) "
            "and that the database server is running"
        )
    if isinstance(error, dibs.DibsError):
        return str(error)
    return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"


def redacted(message: str, ctx: click.Context) -> str:
    """``message`` with the password of the database URL (from --db or the environment) replaced by ***."""
    urls = [ctx.params.get("db"), os.environ.get("DIBS_DATABASE_URL")]
    for url in urls:
        found = _PASSWORD.search(url or "")
        if found:
            for form in {found["password"], unquote(found["password"])}:
                message = message.replace(f":{form}@", ":***@")
                # A password of a few characters alone would blank out parts of words; in a URL it is caught.
                if len(form) >= 4:
                    message = message.replace(form, "***")
    return message


def fail(message: str) -> NoReturn:
    raise click.ClickException(message)


def purge_age(older_than: float | None, everything: bool) -> timedelta:
    """How long ago the rows a purge deletes must have finished: a purge says so, or says --all."""
    if older_than is None and not everything:
        raise click.UsageError(
            "say which rows to delete: pass --older-than HOURS (finished at least that long ago) or --all"
        )
    if older_than is not None and everything:
        raise click.UsageError("pass --older-than HOURS or --all, not both")
    return timedelta(0) if everything else hours(older_than or 0, "--older-than", zero=True)


def hours(value: float, option: str, *, zero: bool = False) -> timedelta:
    """An option given in hours, checked as every duration is (past 100 years, or NaN, is refused)."""
    try:
        return timedelta(seconds=checked_seconds(value * 3600, option, zero=zero))
    except InvalidArgument:
        least = "from 0" if zero else "above 0"
        raise InvalidArgument(f"{option} takes hours, {least} up to 876,000 (100 years), got {value!r}") from None


def confirmed(summary: str, yes: bool) -> bool:
    """Whether to go on with the deletion ``summary`` describes: --yes, or a yes at the terminal. Without a
    terminal to ask on and without --yes, nothing is deleted and the command fails."""
    click.echo(summary)
    if yes:
        return True
    if not sys.stdin.isatty():
        fail("nothing was deleted: there is no terminal to ask on; pass --yes to delete without asking")
    if click.confirm("delete them?", default=False):
        return True
    click.echo("nothing was deleted")
    return False


def run(action: Any) -> Any:
    """Run an action, turning dibs and database errors into a clear message and exit status 1."""
    try:
        return action()
    except (dibs.DibsError, sa.exc.SQLAlchemyError) as exc:
        raise click.ClickException(explained(exc)) from exc


def load_app(spec: str) -> App:
    """The dibs.App named by ``spec`` (module:attribute), on the database the command was given."""
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
        app: App = found[0]
    else:
        app = getattr(module, attribute, None)  # type: ignore[assignment]
        if not isinstance(app, App):
            fail(f"{spec!r} is not a dibs.App (it is {type(app).__name__})")
    _check_same_database(spec, app, click.get_current_context())
    return app


def _check_same_database(spec: str, app: App, ctx: click.Context) -> None:
    """Refuse an app that names a database of its own other than the one --db or $DIBS_DATABASE_URL gives:
    running or enqueueing on either one silently would leave the jobs where the other side never looks."""
    root = ctx.find_root()
    source = root.get_parameter_source("db")
    if source not in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
        return
    given = sa.make_url(root.obj["db"])
    own = run(lambda: app.engine.url)
    if same_database(given, own):
        return
    named_by = "--db" if source is ParameterSource.COMMANDLINE else "$DIBS_DATABASE_URL"
    fail(
        f"{spec} uses the database {shown_url(own)}, but {named_by} names "
        f"{shown_url(given)}; pass the app's database, or leave {named_by} out, or "
        "have the app take its database from the command by creating it without a URL (dibs.App())"
    )


#: Servers' ports when a URL leaves them out, and the names of this machine, so that two spellings of
#: one database (``localhost`` and ``127.0.0.1:5432``) are not taken for two.
_DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306}
_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})


def same_database(first: sa.URL, second: sa.URL) -> bool:
    """Whether two URLs name the same database, whatever driver reaches it and however the address of a
    server on this machine or its default port is written."""

    def identity(url: sa.URL) -> tuple[Any, ...]:
        backend = "mysql" if url.get_backend_name() == "mariadb" else url.get_backend_name()
        database = url.database
        if backend == "sqlite" and database and database != ":memory:":
            database = os.path.abspath(database)
        host = (url.host or "").lower()
        port = url.port or _DEFAULT_PORTS.get(backend)
        return backend, "loopback" if host in _LOOPBACK else host, port, url.username, database

    return identity(first) == identity(second)


#: A row id on the command line: the ids of every backend's tables are positive 64-bit integers.
ROW_ID = click.IntRange(1, LARGEST_ID)


def all_in(found: Iterable[Any], states: tuple[str, ...], done: str, kind: str) -> None:
    """Fail, changing nothing, unless every one of these jobs or events (``kind``) is in one of ``states``."""
    for item in found:
        if item.status not in states:
            fail(f"{kind} {item.id} is {item.status}; only {' or '.join(states)} {kind}s can be {done}")


def existing(ids: Iterable[int], get: Callable[[int], Any]) -> list[Any]:
    """What ``get`` returns for each id, checked before a command changes any of them: a missing id is an
    error (exit status 1) and nothing is changed."""
    found = []
    for item in ids:
        found.append(run(lambda item=item: get(item)))
    return found


def add_plain_row(table: Table, *values: str) -> None:
    """Add a row of values shown as written: rich reads ``[...]`` in a plain string as markup, and a
    job's error or an event's name from the database may hold anything."""
    table.add_row(*(Text(value) for value in values))


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


def echo_record(title: str, fields: Iterable[tuple[str, Any]], sections: Iterable[tuple[str, str | None]]) -> None:
    """A job or an event for ``show``: its fields one a line, then each long one (a payload, the last
    error with its traceback) in full under its name."""
    click.echo(title)
    for name, value in fields:
        click.echo(f"  {name:<17} {shown(value)}")
    for name, text in sections:
        click.echo(f"{name}:" + (f"\n{text.rstrip()}" if text else " -"))


def echo_json(fields: dict[str, Any]) -> None:
    """A job or an event for ``show --json``: every field is JSON already, or a time."""
    click.echo(json.dumps(fields, default=lambda moment: moment.isoformat(), indent=2))


def shown(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S.%f UTC")
    return str(value)
