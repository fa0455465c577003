"""Server versions, and the warning given when a server is too old for a backend's fast path."""

from __future__ import annotations

import warnings

from sqlalchemy.engine import Dialect

from dibs._errors import FallbackWarning


def server_version(dialect: Dialect) -> tuple[int, ...]:
    """The connected server's version numbers, () before the first connection."""
    numbers: list[int] = []
    for part in dialect.server_version_info or ():
        if not isinstance(part, int):
            break
        numbers.append(part)
    return tuple(numbers)


def warn_fallback(product: str, version: tuple[int, ...], missing: str, since: tuple[int, ...], instead: str) -> None:
    """Say, once per engine, that the server lacks the fast path's feature and what dibs does instead."""
    warnings.warn(
        f"{product} {'.'.join(map(str, version))} has no {missing} ({product} {'.'.join(map(str, since))} "
        f"and later do); dibs {instead}, which is correct but slower.",
        FallbackWarning,
        stacklevel=6,
    )
