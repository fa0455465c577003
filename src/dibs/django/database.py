"""Django's databases as SQLAlchemy sees them: a URL for workers, and Django's own open connection for enqueues."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.pool import StaticPool

#: The SQLAlchemy driver for each of Django's database engines.
DRIVERS = {
    "django.db.backends.postgresql": "postgresql+psycopg",
    "django.db.backends.sqlite3": "sqlite+pysqlite",
    # Django's MySQL backend runs on mysqlclient, so it is there for dibs too.
    "django.db.backends.mysql": "mysql+mysqldb",
}


class _ConvertedDateTime(sqlite.DATETIME):
    """A DATETIME read from Django's SQLite connections, which turn such columns into datetimes themselves."""

    def result_processor(self, dialect: sa.Dialect, coltype: object) -> Callable[[Any], Any] | None:
        parse = super().result_processor(dialect, coltype)

        def process(value: Any) -> Any:
            if value is None or isinstance(value, datetime) or parse is None:
                return value
            return parse(value)

        return process


#: The column types SQLAlchemy reads differently on the connections Django opens, by Django engine.
JOINED_TYPES: dict[str, dict[type[Any], type[Any]]] = {"django.db.backends.sqlite3": {sa.DateTime: _ConvertedDateTime}}


def url_of(settings: dict[str, Any]) -> sa.URL:
    """The SQLAlchemy URL of the database a Django ``DATABASES`` entry (or a connection's settings) names."""
    engine = settings["ENGINE"]
    if engine not in DRIVERS:
        raise ValueError(f"dibs cannot reach a Django database of engine {engine!r}; it knows {', '.join(DRIVERS)}")
    driver = DRIVERS[engine]
    if driver.startswith("sqlite"):
        return sa.URL.create(driver, database=str(settings["NAME"]))
    port = settings.get("PORT")
    return sa.URL.create(
        driver,
        username=settings.get("USER") or None,
        password=settings.get("PASSWORD") or None,
        host=settings.get("HOST") or None,
        port=int(port) if port else None,
        database=settings.get("NAME") or None,
    )


@contextmanager
def joined(alias: str) -> Iterator[Connection]:
    """A SQLAlchemy Connection on Django's open connection ``alias``: what runs on it joins the transaction
    Django has open there (a request's ``atomic`` block), and neither commits nor rolls back."""
    from django.db import connections

    django_connection = connections[alias]
    django_connection.ensure_connection()
    raw = django_connection.connection
    engine = sa.create_engine(
        url_of(django_connection.settings_dict).set(username=None, password=None, host=None, port=None),
        creator=lambda: raw,
        poolclass=StaticPool,
        # Returning the connection must not end Django's transaction.
        pool_reset_on_return=None,
    )
    types = JOINED_TYPES.get(django_connection.settings_dict["ENGINE"])
    if types:
        engine.dialect.colspecs = {**engine.dialect.colspecs, **types}
    # Django ends the transaction: SQLAlchemy, closing its Connection, must not roll it back or commit it.
    engine.dialect.do_rollback = engine.dialect.do_commit = lambda dbapi_connection: None  # type: ignore[method-assign]
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        engine.dispose(close=False)
