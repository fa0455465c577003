"""The bare-driver connections the raw floors use, from the same SQLAlchemy URLs dibs is given."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa


def psycopg_connect(url: str, **options: Any) -> Any:
    """A psycopg 3 connection to the database of ``url``, with psycopg's ``options`` (``autocommit=True``)."""
    import psycopg

    address = sa.make_url(url)
    return psycopg.connect(
        host=address.host,
        port=address.port,
        user=address.username,
        password=address.password,
        dbname=address.database,
        **options,
    )
