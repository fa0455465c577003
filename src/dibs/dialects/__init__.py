"""One module per database family; the rest of dibs never writes dialect SQL.

``backend_for`` finds the module for a SQLAlchemy dialect, ``strategy_for`` the claim strategy: the
backend's native one by default, or one chosen by name (``"portable"`` works everywhere, so that it
is tested everywhere too).
"""

from __future__ import annotations

from weakref import WeakKeyDictionary

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

from dibs._errors import InvalidArgument
from dibs.dialects.backend import Backend
from dibs.dialects.mysql import MySQL, MySQLClaim
from dibs.dialects.portable import PortableBackend, PortableClaim
from dibs.dialects.postgresql import MATERIALIZED_SINCE, PostgreSQL, PostgreSQLClaim
from dibs.dialects.request import ClaimRequest, ClaimStrategy
from dibs.dialects.sqlite import SQLite, SQLiteClaim
from dibs.dialects.versions import server_version

__all__ = [
    "STRATEGIES",
    "Backend",
    "ClaimRequest",
    "ClaimStrategy",
    "async_url",
    "backend_for",
    "backend_named",
    "strategy_for",
]

_BACKENDS: dict[str, Backend] = {
    "postgresql": PostgreSQL(),
    "sqlite": SQLite(),
    "mysql": MySQL(),
    "mariadb": MySQL(),
}
_PORTABLE = PortableBackend()

#: The strategies a caller may pick by name, and the dialect each needs (None: any).
STRATEGIES: dict[str, str | None] = {
    "postgresql": "postgresql",
    "sqlite": "sqlite",
    "sqlite-legacy": "sqlite",
    "mysql": "mysql",
    "portable": None,
}

_chosen: WeakKeyDictionary[Dialect, dict[str | None, ClaimStrategy]] = WeakKeyDictionary()


def backend_for(dialect: Dialect) -> Backend:
    """The backend for a SQLAlchemy dialect; dialects dibs has no module for get the generic one."""
    return backend_named(dialect.name)


def backend_named(name: str) -> Backend:
    """The backend for a dialect name such as ``"postgresql"`` (a URL's backend name)."""
    return _BACKENDS.get(name, _PORTABLE)


def async_url(url: sa.URL) -> sa.URL:
    """The URL of the same database through the asyncio driver dibs uses for its family; InvalidArgument
    for a family dibs knows no asyncio driver of."""
    backend = backend_named(url.get_backend_name())
    if backend.async_driver is None:
        raise InvalidArgument(
            f"dibs knows no asyncio driver for {url.get_backend_name()!r} databases, which an async transactional "
            "task needs; make the task a sync function, or use PostgreSQL, SQLite, MySQL or MariaDB"
        )
    return url.set(drivername=f"{url.get_backend_name()}+{backend.async_driver}")


def strategy_for(dialect: Dialect, name: str | None = None) -> ClaimStrategy:
    """The claim strategy for a connected dialect: its native one, or the one named.

    The choice is made once per engine, so a fallback warning is given once, not at every claim.
    """
    per_dialect = _chosen.setdefault(dialect, {})
    strategy = per_dialect.get(name)
    if strategy is None:
        strategy = per_dialect[name] = _choose(dialect, name)
    return strategy


def _choose(dialect: Dialect, name: str | None) -> ClaimStrategy:
    from dibs.dialects.batch import check_paramstyle  # batch builds on this package

    check_paramstyle(dialect)  # an engine of the caller's, given to dibs.claim or Leases
    backend = backend_for(dialect)
    if name is None:
        return backend.native_strategy(dialect)
    if name not in STRATEGIES:
        raise InvalidArgument(
            f"unknown claim strategy {name!r}; choose one of {', '.join(sorted(STRATEGIES))}, "
            "or leave strategy unset to use the database's native one"
        )
    needed = STRATEGIES[name]
    if needed is not None and backend.name != needed:
        raise InvalidArgument(
            f"the {name!r} claim strategy needs a {needed} database, but this engine is {dialect.name}; "
            "use 'portable' or leave strategy unset"
        )
    if name == "portable":
        return PortableClaim(backend)
    if name == "postgresql":
        version = server_version(dialect)
        assert isinstance(backend, PostgreSQL)
        return PostgreSQLClaim(backend, materialized=not version or version >= MATERIALIZED_SINCE)
    if isinstance(backend, SQLite):
        return SQLiteClaim(backend, returning=name == "sqlite")
    assert isinstance(backend, MySQL)
    return MySQLClaim(backend)
