"""A stand-in for a Connection that records the statements a migration step runs instead of running them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine.mock import MockConnection
from sqlalchemy.sql.base import Executable


class _NoRows:
    """The answer to a query in a recording: no rows, as in a database an older dibs left unchanged."""

    def all(self) -> list[Any]:
        return []

    def __iter__(self) -> Any:
        return iter(())


class Recorder(MockConnection):
    """What a migration step needs of a Connection, keeping each statement as SQL of ``dialect``.

    A step sees the tables an older dibs made (``tables``) as they were before any later step changed them:
    its queries find no rows, so the SQL recorded is what that step does to such a database. Every CREATE
    is recorded, none checked first.
    """

    def __init__(self, dialect: sa.Dialect, tables: Iterable[str]) -> None:
        super().__init__(dialect, self._executed)
        #: The tables the database had before the recorded steps.
        self.tables = set(tables)
        #: The statements recorded, as SQL text without the closing semicolon.
        self.statements: list[str] = []

    def _executed(self, statement: Executable, parameters: Any = None) -> _NoRows:
        if not _reads(statement):
            self.record(statement)
        return _NoRows()

    def exec_driver_sql(self, statement: str, parameters: Any = None) -> _NoRows:
        self.statements.append(statement.strip())
        return _NoRows()

    def record(self, statement: Executable) -> None:
        """Keep ``statement`` as SQL, its values written in."""
        compiled = statement.compile(dialect=self.dialect, compile_kwargs={"literal_binds": True})  # type: ignore[attr-defined]
        self.statements.append(str(compiled).strip())

    def in_transaction(self) -> bool:
        return False

    def commit(self) -> None:
        return None


def _reads(statement: Executable) -> bool:
    if isinstance(statement, sa.TextClause):
        return statement.text.lstrip().upper().startswith("SELECT")
    return isinstance(statement, sa.Select)
