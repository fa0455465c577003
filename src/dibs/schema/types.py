"""The column types of the dibs tables, and reading their timestamps back."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import overload

import sqlalchemy as sa
from sqlalchemy.dialects import mysql


class _UtcTimestamp(sa.types.TypeDecorator[datetime]):
    """A point in time with microseconds on every backend: timestamptz on PostgreSQL, DATETIME(6) holding
    UTC on MySQL and MariaDB (plain DATETIME drops the fraction), ISO text in UTC on SQLite. An aware value
    is bound as the same instant in UTC: where the column has no time zone, SQLAlchemy drops the offset
    without converting, and 12:00+02:00 would be stored as 12:00 UTC. A naive value is taken as UTC."""

    impl = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is not None and value.tzinfo is not None and value.utcoffset():
            return value.astimezone(timezone.utc)
        return value


#: A point in time with microseconds on every backend, stored in UTC (see _UtcTimestamp).
Timestamp = _UtcTimestamp()


@overload
def aware(moment: datetime) -> datetime: ...
@overload
def aware(moment: None) -> None: ...
def aware(moment: datetime | None) -> datetime | None:
    """A Timestamp as read back, with its time zone: backends without time zones store UTC."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=timezone.utc)


#: Text of any length (MySQL's TEXT stops at 64 KiB).
LongText = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")
