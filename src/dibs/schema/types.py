"""The column types of the dibs tables, and reading their timestamps back."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import overload

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

#: A point in time with microseconds on every backend: timestamptz on PostgreSQL, DATETIME(6) holding
#: UTC on MySQL and MariaDB (plain DATETIME drops the fraction), ISO text in UTC on SQLite.
Timestamp = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


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
