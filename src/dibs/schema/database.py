"""The database a front object (an App, an Outbox) keeps its tables in: given as an Engine or a URL, the
engine made on first use, the tables created or upgraded by ``init()``."""

from __future__ import annotations

from sqlalchemy.engine import Engine

from dibs._errors import InvalidArgument
from dibs.dialects.batch import check_paramstyle
from dibs.dialects.sqlite import private_to_each_connection
from dibs.engine import checked_url, create_engine, database_url, shown_url
from dibs.schema.migrations import migrate


class DibsDatabase:
    """An Engine given, or one made from a URL (``db``, else ``$DIBS_DATABASE_URL``, else the SQLite file
    ``dibs.sqlite``) when first used.

    A URL that can never work (an unknown kind of database, a driver not installed, an SQLite database in
    memory, which every connection of a worker would see empty) is refused at once; one that may work later (a
    server not up yet) fails when it is first used.
    """

    def __init__(self, db: str | Engine | None = None) -> None:
        if isinstance(db, Engine):
            check_paramstyle(db.dialect)  # the caller's engine: refused, left as it is
            self._engine: Engine | None = db
            #: The database's URL, its password hidden.
            self.url = shown_url(db.url)
        else:
            self._engine = None
            self.url = database_url(db)
            if private_to_each_connection(checked_url(self.url)):
                raise InvalidArgument(
                    f"{self.url!r} is an SQLite database in memory, a new empty one for every connection, and "
                    "workers use several; use a file, such as sqlite:///dibs.sqlite (or one in a temporary folder)"
                )

    @property
    def engine(self) -> Engine:
        """The Engine the tables live in, created on first use."""
        if self._engine is None:
            self._engine = create_engine(self.url)
        return self._engine

    def init(self) -> list[int]:
        """Create or upgrade the dibs tables.

        Returns:
            The schema versions applied, none when the database was up to date.

        Example:
            >>> app.init()  # a second time: nothing left to apply
            []
        """
        return [step.version for step in migrate(self.engine)]
