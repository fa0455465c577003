"""Whether a database has the dibs tables this dibs needs, and :class:`~dibs.SchemaMissing` when not."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dibs._errors import SchemaMissing
from dibs.engine import connected
from dibs.schema.migrations import MIGRATIONS, Migration, tables_and_version


def _gone(present: set[str], done: int, migrations: tuple[Migration, ...]) -> list[str]:
    return [
        step.creates
        for step in sorted(migrations, key=lambda step: step.version)
        if step.version <= done and step.creates is not None and step.creates not in present
    ]


def missing_tables(bind: Engine | Connection, migrations: tuple[Migration, ...] = MIGRATIONS) -> list[str]:
    """The tables of applied migrations that the database no longer has (dropped after `dibs init`)."""
    with connected(bind) as conn:
        present, done = tables_and_version(conn)
    return _gone(present, done, migrations)


def schema_problem(bind: Engine | Connection, migrations: tuple[Migration, ...] = MIGRATIONS) -> SchemaMissing | None:
    """What is wrong with the dibs tables, saying what to run; None when they are all there and current.
    Two queries on one connection: every worker asks as it starts."""
    with connected(bind) as conn:
        present, have = tables_and_version(conn)
    want = max(step.version for step in migrations)
    if have < want:
        what = "has no dibs tables" if have == 0 else f"has dibs schema version {have}, this dibs needs {want}"
        return SchemaMissing(
            f"the database {what}; run `dibs --db URL init` (or dibs.migrate(engine)) to create or upgrade them"
        )
    gone = _gone(present, have, migrations)
    if gone:
        return SchemaMissing(
            f"the database lacks the dibs table{'s' if len(gone) > 1 else ''} {', '.join(gone)} (dropped after "
            "`dibs init` created it); run `dibs --db URL init` (or dibs.migrate(engine)) to create it again"
        )
    return None


def require_current(bind: Engine | Connection, migrations: tuple[Migration, ...] = MIGRATIONS) -> None:
    """Raise SchemaMissing, saying what to run, unless every migration has been applied and its tables exist."""
    problem = schema_problem(bind, migrations)
    if problem is not None:
        raise problem


def translated(error: Exception, engine: Engine) -> Exception:
    """For a statement that failed: SchemaMissing (caused by ``error``) when the failure is that the dibs
    tables are missing or out of date, else ``error`` itself. The tables are looked up on a connection of
    its own, since the one that failed may be in an aborted transaction."""
    if not isinstance(error, (sa.exc.ProgrammingError, sa.exc.OperationalError)) or error.connection_invalidated:
        return error
    try:
        problem = schema_problem(engine)
    except Exception:  # the database is away: the original error says more
        return error
    if problem is None:
        return error
    problem.__cause__ = error
    return problem


@contextmanager
def tables_checked(engine: Engine) -> Iterator[None]:
    """Turn the failure of a statement run in the block into SchemaMissing, saying what to run, when the
    dibs tables of ``engine``'s database are missing or out of date (see :func:`translated`)."""
    try:
        yield
    except sa.exc.DBAPIError as error:
        problem = translated(error, engine)
        if problem is error:
            raise
        raise problem from error
