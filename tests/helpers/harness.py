"""A sync face over sync and async targets, so that each conformance test is written once."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.pool import StaticPool

import dibs
from tests.helpers.targets import Target, with_driver

T = TypeVar("T")


class Harness:
    """One target's engine, the tables a test made on it, and calls that look the same sync or async."""

    def __init__(self, target: Target, url: sa.URL, *, table_prefix: str) -> None:
        self.target = target
        self.url = url
        self.prefix = table_prefix
        self.metadata = sa.MetaData()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.engine: Any
        if target.memory:
            self.engine = dibs.create_engine(url, poolclass=StaticPool)
            self.admin = self.engine
        elif target.is_async:
            self.loop = asyncio.new_event_loop()
            self.engine = dibs.create_async_engine(url)
            self.admin = dibs.create_engine(with_driver(url, target.sync_driver))
        else:
            self.engine = dibs.create_engine(url)
            self.admin = self.engine

    @property
    def family(self) -> str:
        return self.target.family

    def table(self, name: str, *columns: sa.Column[Any] | sa.Index) -> sa.Table:
        table = sa.Table(self.prefix + name, self.metadata, *columns)
        table.create(self.admin)
        return table

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        assert self.loop is not None
        return self.loop.run_until_complete(coroutine)

    def claim(self, table: Any, **options: Any) -> list[sa.Row[Any]]:
        options.setdefault("strategy", self.target.strategy)
        if self.target.is_async:
            return self.run(dibs.aclaim(self.engine, table, **options))
        return dibs.claim(self.engine, table, **options)

    def leases(self, table: Any, **options: Any) -> dibs.Leases:
        return dibs.Leases(table, strategy=self.target.strategy, **options)

    def lease(self, leases: dibs.Leases, action: str, *args: Any, **options: Any) -> Any:
        """Call ``leases.<action>`` (or its ``a<action>`` twin on async targets) on this target's engine."""
        if self.target.is_async:
            return self.run(getattr(leases, "a" + action)(self.engine, *args, **options))
        return getattr(leases, action)(self.engine, *args, **options)

    def rows(self, statement: sa.Executable) -> list[sa.Row[Any]]:
        with self.admin.connect() as conn:
            return list(conn.execute(statement))

    def scalar(self, statement: sa.Executable) -> Any:
        with self.admin.connect() as conn:
            return conn.execute(statement).scalar()

    def execute(self, statement: sa.Executable, parameters: Any = None) -> None:
        with self.admin.begin() as conn:
            conn.execute(statement, parameters)

    def close(self) -> None:
        if self.loop is not None:
            self.loop.run_until_complete(self.engine.dispose())
            self.loop.close()
        self.metadata.drop_all(self.admin)
        self.admin.dispose()
