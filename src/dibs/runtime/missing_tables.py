"""A service whose tables are missing (dropped, or not yet made by ``dibs init``) says so once a minute, not
at every try, and keeps trying."""

from __future__ import annotations

import logging
import time

from dibs._errors import SchemaMissing

#: Seconds between two reports of the same missing tables.
REPORT_EVERY = 60.0


class MissingTables:
    """Logs that the dibs tables are missing, at most once every :data:`REPORT_EVERY` seconds while they are.

    Args:
        log: The logger to report to.
        what: What the service cannot do without them, for the report ("worker w1 cannot reach its jobs").

    Example:
        >>> missing = MissingTables(logging.getLogger("dibs"), "worker w1 cannot reach its jobs")
        >>> missing.report(ValueError("not about tables"))
        False
    """

    def __init__(self, log: logging.Logger, what: str) -> None:
        self._log = log
        self._what = what
        self._reported: float | None = None

    def report(self, error: Exception) -> bool:
        """Log a :class:`~dibs.SchemaMissing` (unless it was logged less than a minute ago).

        Returns:
            True if ``error`` was about the missing tables; False for any other error, left to the caller.
        """
        if not isinstance(error, SchemaMissing):
            return False
        now = time.monotonic()
        if self._reported is None or now - self._reported > REPORT_EVERY:
            self._reported = now
            self._log.error("%s, and keeps trying: %s", self._what, error)
        return True

    def clear(self) -> None:
        """The tables are back: report the next time they go missing at once."""
        self._reported = None
