"""The log lines of the long-running commands (``dibs worker``, ``dibs outbox relay``): text for people, or
one JSON object a line for log shippers (``--log-format json``)."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from typing import Any

import click

#: The formats ``--log-format`` takes; the first is the default.
FORMATS = ("text", "json")
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: Libraries that log every request or statement at INFO: they stay at WARNING unless their level is set, so
#: that a worker's INFO lines are its own.
CHATTY = ("httpx", "httpcore", "aio_pika", "aiormq", "nats", "redis", "sqlalchemy", "uvicorn.access", "asyncio")
#: The attributes every LogRecord has: anything else on a record came from ``extra=`` and is a field.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}

log_format_option = click.option(
    "--log-format",
    type=click.Choice(FORMATS),
    default=FORMATS[0],
    show_default=True,
    help="How log lines are written to stderr: text, or one JSON object a line (time, level, logger, message "
    "and fields such as job_id, task, attempt, duration, outcome) for log shippers.",
)


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC, ISO 8601), level, logger, message, the record's ``extra=`` fields,
    and the traceback as ``exception`` when there is one.

    Example:
        >>> handler = logging.StreamHandler()
        >>> handler.setFormatter(JsonFormatter())
    """

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name not in _STANDARD and not name.startswith("_"):
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure(log_format: str) -> None:
    """Log INFO and up to stderr in ``log_format``, once, through the root logger (so no line is written
    twice), with chatty libraries at WARNING; a process that set up logging already keeps its own."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    for name in CHATTY:
        library = logging.getLogger(name)
        if library.level == logging.NOTSET:
            library.setLevel(logging.WARNING)
