"""Whether two database URLs name one database, as ``dibs worker`` and ``dibs enqueue`` decide it when an app
names its own database and --db or $DIBS_DATABASE_URL names one too."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

pytest.importorskip("click")

from dibs.cli.shared import same_database

SAME = [
    ("postgresql+psycopg://app@localhost/shop", "postgresql://app@127.0.0.1:5432/shop"),
    ("postgresql+asyncpg://app:secret@db.example/shop", "postgresql+psycopg://app@DB.example:5432/shop"),
    ("mysql+pymysql://root@127.0.0.1/test", "mariadb+pymysql://root@localhost:3306/test"),
    ("sqlite:///jobs.sqlite", "sqlite+pysqlite:///./jobs.sqlite"),
]
DIFFERENT = [
    ("postgresql://app@localhost/shop", "postgresql://app@localhost:5433/shop"),
    ("postgresql://app@localhost/shop", "postgresql://app@db.example/shop"),
    ("postgresql://app@localhost/shop", "postgresql://other@localhost/shop"),
    ("postgresql://app@localhost/shop", "postgresql://app@localhost/shop2"),
    ("postgresql://app@localhost/shop", "mysql://app@localhost/shop"),
    ("sqlite:///jobs.sqlite", "sqlite:///other.sqlite"),
]


@pytest.mark.parametrize(("first", "second"), SAME)
def test_two_spellings_of_one_database_are_the_same(first: str, second: str) -> None:
    assert same_database(sa.make_url(first), sa.make_url(second))
    assert same_database(sa.make_url(second), sa.make_url(first))


@pytest.mark.parametrize(("first", "second"), DIFFERENT)
def test_another_server_port_user_or_database_is_another_database(first: str, second: str) -> None:
    assert not same_database(sa.make_url(first), sa.make_url(second))
