"""The SQL of dibs's migrations, for database administrators who apply schema changes by hand.

The SQL comes from the migrations themselves, run against a :class:`~dibs.schema.recorder.Recorder` instead of a
database, so the script and :func:`dibs.migrate` cannot drift apart.
"""

from __future__ import annotations

from typing import cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dibs._errors import InvalidArgument
from dibs.dialects import backend_for
from dibs.schema.migrations import LATEST, MIGRATIONS
from dibs.schema.recorder import Recorder
from dibs.schema.tables import schema_versions

#: The dialects ``dibs sql`` writes for, by the name its --dialect option takes.
DIALECTS = ("postgresql", "sqlite", "mysql", "mariadb")


def migration_sql(dialect: str | sa.Dialect, start: int = 0, end: int = LATEST) -> str:
    """The SQL that brings a database from schema version ``start`` to ``end``, as :func:`dibs.migrate` would.

    Each step's statements are followed by the row that records it in ``dibs_schema``, so that
    :func:`dibs.migrate` sees a database migrated by hand as current. The row's time is the database clock's
    where the database has a UTC clock in SQL, else the time the SQL was written (SQLite).

    Args:
        dialect: ``"postgresql"``, ``"sqlite"``, ``"mysql"`` (MySQL 8) or ``"mariadb"``, or a SQLAlchemy
            dialect.
        start: The version the database has now (0: no dibs tables).
        end: The version to reach.

    Returns:
        The statements, each ending with a semicolon, every step headed by a comment.

    Raises:
        InvalidArgument: The dialect is unknown, or the versions are out of range.

    Example:
        >>> print(dibs.migration_sql("postgresql", start=3))  # doctest: +SKIP
    """
    lines: list[str] = []
    for heading, statements in _steps(dialect, start, end):
        lines += [f"-- {heading}", *(f"{statement};" for statement in statements), ""]
    return "\n".join(lines)


def migration_statements(dialect: str | sa.Dialect, start: int = 0, end: int = LATEST) -> list[str]:
    """The statements of :func:`migration_sql`, one string each, without semicolons: for a migration tool
    that runs them itself, such as an Alembic revision (``op.execute``).

    Args:
        dialect: As for :func:`migration_sql`.
        start: The version the database has now (0: no dibs tables).
        end: The version to reach.

    Returns:
        The statements, in order.

    Raises:
        InvalidArgument: The dialect is unknown, or the versions are out of range.

    Example:
        >>> for statement in migration_statements(op.get_bind().dialect):  # doctest: +SKIP
        ...     op.execute(statement)
    """
    return [statement for _, statements in _steps(dialect, start, end) for statement in statements]


def _steps(dialect: str | sa.Dialect, start: int, end: int) -> list[tuple[str, list[str]]]:
    """Each step from ``start`` to ``end`` as a heading and its statements, the version row last."""
    resolved = _dialect(dialect)
    if not 0 <= start <= end <= LATEST:
        raise InvalidArgument(
            f"cannot write the SQL from version {start} to {end}: versions run from 0 to {LATEST}, start <= end"
        )
    older = {step.creates for step in MIGRATIONS if step.version <= start and step.creates is not None}
    recorder = Recorder(resolved, older)
    steps: list[tuple[str, list[str]]] = []
    if start == 0:
        recorder.record(sa.schema.CreateTable(schema_versions))
        steps.append(("dibs_schema: the migrations applied", _flush(recorder)))
    for step in sorted(MIGRATIONS, key=lambda migration: migration.version):
        if start < step.version <= end:
            step.apply(cast(Connection, recorder))
            now = backend_for(recorder.dialect).now()
            recorder.record(schema_versions.insert().values(version=step.version, applied_at=now))
            steps.append((f"dibs migration {step.version}: {step.description}", _flush(recorder)))
    return steps


def _flush(recorder: Recorder) -> list[str]:
    statements = list(recorder.statements)
    recorder.statements.clear()
    return statements


def _dialect(dialect: str | sa.Dialect) -> sa.Dialect:
    if not isinstance(dialect, str):
        return dialect
    if dialect not in DIALECTS:
        raise InvalidArgument(f"no dialect named {dialect!r}; pick one of {', '.join(DIALECTS)}")
    return sa.make_url(f"{dialect}://").get_dialect()()
