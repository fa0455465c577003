"""Publishers that need no broker: ``log://`` writes each event to the ``dibs.outbox.events`` logger,
``stdout://`` writes each as one JSON line on standard output. For development, and for pipelines that
read a process's output."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from urllib.parse import urlsplit

from dibs._errors import BrokerUnavailable, InvalidArgument
from dibs.outbox.events import OutboxEvent
from dibs.outbox.publishers.base import Publisher, envelope, split_options

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


class LogPublisher(Publisher):
    """``log://?level=info&logger=dibs.outbox.events``"""

    def __init__(self, url: str) -> None:
        _, options = split_options(url, {"level": "info", "logger": "dibs.outbox.events"})
        level = options["level"].lower()
        if level not in _LEVELS:
            raise InvalidArgument(f"level= must be one of {', '.join(_LEVELS)}, got {options['level']!r}")
        self.level = _LEVELS[level]
        self.logger = logging.getLogger(options["logger"])
        self.description = f"the {options['logger']} logger"

    async def publish(self, events: Sequence[OutboxEvent]) -> list[BaseException | None]:
        for event in events:
            self.logger.log(self.level, "%s", envelope(event))
        return [None] * len(events)


class StdoutPublisher(Publisher):
    """``stdout://``: one JSON object per line, flushed after each batch."""

    description = "standard output"

    def __init__(self, url: str) -> None:
        if urlsplit(url).query:
            raise InvalidArgument(f"stdout:// takes no options, got {url!r}")

    async def publish(self, events: Sequence[OutboxEvent]) -> list[BaseException | None]:
        try:
            sys.stdout.write("".join(envelope(event) + "\n" for event in events))
            sys.stdout.flush()
        except OSError as exc:  # the reader went away: nothing counts against the events
            raise BrokerUnavailable(f"cannot write to standard output: {exc}") from exc
        return [None] * len(events)
