"""create_engine and create_async_engine: SQLAlchemy engines tuned for many concurrent claimers."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dibs._errors import InvalidArgument
from dibs.dialects import backend_for, backend_named

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine


def create_engine(url: str | sa.URL, **options: Any) -> Engine:
    """A SQLAlchemy Engine for ``url``, tuned for claiming (on SQLite: WAL, a busy timeout)."""
    checked = _checked(url)
    engine = sa.create_engine(checked, **backend_named(checked.get_backend_name()).engine_options(options))
    backend_for(engine.dialect).configure(engine)
    return engine


def create_async_engine(url: str | sa.URL, **options: Any) -> AsyncEngine:
    """An asyncio Engine for ``url`` (an async driver, such as postgresql+psycopg or sqlite+aiosqlite)."""
    from sqlalchemy.ext.asyncio import create_async_engine as create

    checked = _checked(url)
    engine = create(checked, **backend_named(checked.get_backend_name()).engine_options(options))
    backend_for(engine.dialect).configure(engine.sync_engine)
    return engine


def _checked(url: str | sa.URL) -> sa.URL:
    try:
        return sa.make_url(url)
    except sa.exc.ArgumentError as exc:
        raise InvalidArgument(
            f"{url!r} is not a database URL; write it as dialect+driver://user:password@host/database, "
            "for example sqlite:///dibs.sqlite or postgresql+psycopg://user@localhost/app"
        ) from exc


@contextmanager
def connected(bind: Engine | Connection) -> Iterator[Connection]:
    """The given connection, or a new one from the engine that is closed afterwards."""
    if isinstance(bind, Engine):
        with bind.connect() as conn:
            yield conn
    else:
        yield bind
