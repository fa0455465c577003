"""create_engine and create_async_engine: SQLAlchemy engines tuned for many concurrent claimers."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dibs._errors import InvalidArgument
from dibs.dialects import backend_for, backend_named
from dibs.dialects.batch import check_paramstyle
from dibs.dialects.transactions import checked_out

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

#: Where jobs and events live when no database is named: a file in the working directory.
DEFAULT_DATABASE = "sqlite:///dibs.sqlite"


def database_url(db: str | None = None) -> str:
    """``db``, else ``$DIBS_DATABASE_URL``, else the SQLite file ``dibs.sqlite``."""
    return db or os.environ.get("DIBS_DATABASE_URL") or DEFAULT_DATABASE


def create_engine(url: str | sa.URL, **options: Any) -> Engine:
    """A SQLAlchemy Engine for ``url``, tuned for claiming (on SQLite: WAL, a busy timeout; on MySQL and
    MariaDB, a connection dibs gives back right after its own COMMIT is not rolled back again by the pool,
    unless you pass ``pool_reset_on_return``).

    Args:
        url: A database URL, such as ``postgresql+psycopg://localhost/shop`` or ``sqlite:///jobs.sqlite``.
        **options: More options for :func:`sqlalchemy.create_engine`.

    Returns:
        The Engine; nothing is connected to yet.

    Raises:
        InvalidArgument: The URL names an unknown kind of database, a driver that is not installed, or
            an SQLite file in a directory that does not exist.

    Example:
        >>> engine = dibs.create_engine("sqlite:///jobs.sqlite")
    """
    checked = checked_url(url)
    _check_sqlite_directory(checked)
    try:
        engine = sa.create_engine(checked, **backend_named(checked.get_backend_name()).engine_options(options))
    except ImportError as exc:
        raise _missing_driver(checked, exc) from exc
    checked_paramstyle(engine)
    backend_for(engine.dialect).configure(engine, options)
    return engine


def create_async_engine(url: str | sa.URL, **options: Any) -> AsyncEngine:
    """An asyncio Engine for ``url``, tuned for claiming as :func:`create_engine` is.

    Args:
        url: A database URL with an async driver, such as ``postgresql+psycopg`` or ``sqlite+aiosqlite``.
        **options: More options for :func:`sqlalchemy.ext.asyncio.create_async_engine`.

    Returns:
        The AsyncEngine; nothing is connected to yet.

    Raises:
        InvalidArgument: The URL names an unknown kind of database or a driver that is not installed.
    """
    from sqlalchemy.ext.asyncio import create_async_engine as create

    checked = _parsed(url)
    _known_dialect(checked)
    _check_sqlite_directory(checked)
    try:
        engine = create(checked, **backend_named(checked.get_backend_name()).engine_options(options))
    except ImportError as exc:
        raise _missing_driver(checked, exc) from exc
    checked_paramstyle(engine.sync_engine)
    backend_for(engine.dialect).configure(engine.sync_engine, options)
    return engine


def checked_paramstyle(engine: Engine) -> None:
    """InvalidArgument, the engine disposed of, if dibs cannot write its statements in its paramstyle."""
    try:
        check_paramstyle(engine.dialect)
    except InvalidArgument:
        engine.dispose()
        raise


def checked_url(url: str | sa.URL) -> sa.URL:
    """``url`` parsed, if it names a kind of database SQLAlchemy knows and a driver that is installed;
    InvalidArgument saying what to change otherwise. Nothing is connected to."""
    checked = _parsed(url)
    dialect = _known_dialect(checked)
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        raise _missing_driver(checked, exc) from exc
    return checked


#: What to install for the drivers dibs is tested with, by SQLAlchemy driver name.
_EXTRAS = {
    "psycopg": "dibs-sql[postgres]",
    "asyncpg": "dibs-sql[asyncpg]",
    "pymysql": "dibs-sql[mysql]",
    "asyncmy": "dibs-sql[mysql]",
    "aiosqlite": "dibs-sql[sqlite-async]",
}


def _known_dialect(url: sa.URL) -> Any:
    try:
        return url.get_dialect()
    except sa.exc.NoSuchModuleError as exc:
        raise InvalidArgument(
            f"{shown_url(url)!r} names a kind of database, {url.drivername!r}, that "
            "SQLAlchemy does not know; write the URL as sqlite:///dibs.sqlite, "
            "postgresql+psycopg://user@host/database or mysql+pymysql://user@host/database "
            "(or install the SQLAlchemy dialect for it)"
        ) from exc


def _missing_driver(url: sa.URL, exc: ImportError) -> InvalidArgument:
    module = exc.name or str(exc)
    extra = _EXTRAS.get(url.get_driver_name())
    install = f"pip install '{extra}'" if extra else f"install the package that provides {module!r}"
    alternative = {"postgresql": "postgresql+psycopg", "mysql": "mysql+pymysql", "mariadb": "mysql+pymysql"}.get(
        url.get_backend_name()
    )
    instead = f", or use {alternative} (pip install '{_EXTRAS[alternative.split('+')[1]]}')" if alternative else ""
    return InvalidArgument(
        f"the driver {url.get_driver_name()!r} that {url.drivername} needs is not installed (no module named "
        f"{module!r}); {install}{instead}"
    )


def _check_sqlite_directory(url: sa.URL) -> None:
    """An SQLite file can be created, but not the directories leading to it: say so plainly."""
    path = url.database
    if url.get_backend_name() != "sqlite" or not path or path == ":memory:" or path.startswith("file:"):
        return
    directory = Path(path).parent
    if not directory.is_dir():
        raise InvalidArgument(
            f"cannot open the SQLite file {path}: its directory {directory} does not exist; create it, "
            "or fix the path in the URL"
        )


def _parsed(url: str | sa.URL) -> sa.URL:
    try:
        return sa.make_url(url)
    except sa.exc.ArgumentError as exc:
        raise InvalidArgument(
            f"{_redacted(url)!r} is not a database URL; write it as dialect+driver://user:password@host/database, "
            "for example sqlite:///dibs.sqlite or postgresql+psycopg://user@localhost/app"
        ) from None if _has_password(url) else exc
    except ValueError as exc:  # SQLAlchemy reads the port with int(), and says no more than that
        raise InvalidArgument(
            f"the database URL {_redacted(url)!r} is not valid: its port {_port(str(url))!r} is not a number; write "
            "it as dialect+driver://user:password@host:port/database, with the port a number such as 5432"
        ) from exc


#: The password of a URL's user: from the colon after the user name to the last @ before the path.
_PASSWORD = re.compile(r"(://[^:/@]*:)[^/]*@")


def _port(url: str) -> str:
    """What a URL has where its port goes: after the host's last colon."""
    location = url.partition("://")[2].split("/", 1)[0].split("?", 1)[0].rpartition("@")[2]
    return location.rpartition("]")[2].rpartition(":")[2]


def _has_password(url: str | sa.URL) -> bool:
    return isinstance(url, str) and _PASSWORD.search(url) is not None


#: The value of a URL's query option that names a secret: drivers and brokers' clients take passwords and
#: tokens there too.
_SECRET_IN_QUERY = re.compile(
    r"([?&][^=&]*(?:pass|pwd|token|secret|credential|auth|api_?key)[^=&]*=)[^&]*", re.IGNORECASE
)


def query_secrets_hidden(url: str) -> str:
    """``url`` with the values of its query options that name a secret (``?password=``) hidden."""
    return _SECRET_IN_QUERY.sub(r"\1***", url)


def shown_url(url: sa.URL) -> str:
    """A database URL as dibs shows it (a message, the dashboard): its password hidden, in the user part
    and in the query."""
    return query_secrets_hidden(url.render_as_string(hide_password=True))


def _redacted(url: str | sa.URL) -> str:
    """The URL as an error shows it: its password hidden, in the user part and in the query."""
    if isinstance(url, sa.URL):
        return shown_url(url)
    return query_secrets_hidden(_PASSWORD.sub(r"\1***@", url))


@contextmanager
def writing(engine: Engine) -> Iterator[Connection]:
    """A connection in a transaction of dibs's own that writes, committed when the block ends (rolled back
    if it raises). On SQLite it takes the write lock up front, in turn with dibs's other writers, so that
    an enqueue is not left waiting on SQLite's busy handler while workers write; elsewhere it is
    SQLAlchemy's ``engine.begin()``."""
    backend = backend_for(engine.dialect)
    with checked_out(engine, backend.released) as conn, backend.writing(conn):
        yield conn


@contextmanager
def connected(bind: Engine | Connection) -> Iterator[Connection]:
    """The given connection, or a new one from the engine that is closed afterwards."""
    if isinstance(bind, Engine):
        with checked_out(bind, backend_for(bind.dialect).released) as conn:
            yield conn
    else:
        yield bind
