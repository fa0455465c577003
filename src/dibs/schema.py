"""Column types dibs uses in the tables it defines or asks users to add."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

#: A point in time with microseconds on every backend: timestamptz on PostgreSQL, DATETIME(6) holding
#: UTC on MySQL and MariaDB (plain DATETIME drops the fraction), ISO text in UTC on SQLite.
Timestamp = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
