"""Where a lease write runs: the caller's open transaction, or one the backend opens, and asyncio's bridge."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.engine import Connection, Engine

from dibs.dialects import Backend
from dibs.dialects.transactions import checked_out

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

T = TypeVar("T")


@contextmanager
def transaction(bind: Engine | Connection, backend: Backend, *, one_statement: bool = False) -> Iterator[Connection]:
    """The caller's open transaction if it has one (the write joins it), else one the backend opens and commits.

    ``one_statement``: the work is one statement the database runs atomically on its own, which the backend
    may run without BEGIN and COMMIT (see Backend.one_statement).
    """
    if isinstance(bind, Engine):
        with checked_out(bind, backend.released) as conn, opened(backend, conn, one_statement, owned=True):
            yield conn
    elif bind.in_transaction():
        yield bind
    else:
        with opened(backend, bind, one_statement, owned=False):
            yield bind


def opened(backend: Backend, conn: Connection, one_statement: bool, *, owned: bool) -> AbstractContextManager[Any]:
    return backend.one_statement(conn, owned=owned) if one_statement else backend.transaction(conn)


async def run_async(bind: AsyncEngine | AsyncConnection, work: Callable[..., T], *args: Any) -> T:
    from sqlalchemy.ext.asyncio import AsyncEngine

    if isinstance(bind, AsyncEngine):
        async with bind.connect() as conn:
            return await conn.run_sync(work, *args)
    return await bind.run_sync(work, *args)
