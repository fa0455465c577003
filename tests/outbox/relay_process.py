"""A relay in a process of its own, for the tests with several relay processes, a SIGKILL or a SIGTERM.

    python -m tests.outbox.relay_process DB_URL PUBLISHER_URL --name NAME [--ready FILE] [--stats FILE]
        [--batch N] [--concurrency N] [--lease S] [--grace S] [--slow S] [--jitter S] [--publishing FILE]
        [--freeze-after K --frozen FILE]

It publishes through the real publisher the URL names, wrapped so that the test can see and steer it:

* ``--ready``: this file appears once the publisher is connected (the relay is about to claim);
* ``--slow S``: each batch waits S seconds before it is published, and up to ``--jitter`` seconds more, at
  random (so that batches in flight at once reach the broker in any order); ``--publishing`` gets the ids
  of the batch being published (one file, rewritten per batch);
* ``--freeze-after K``: once the broker confirmed the K-th batch, its ids go to the ``--frozen`` file and
  the relay hangs there for good, before it can mark them published: a SIGKILL then lands between the
  publish and the mark;
* ``--stats``: the relay's stats (JSON) once it stopped (SIGTERM stops it gracefully).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import random
from collections.abc import Sequence
from pathlib import Path

import dibs
from dibs.outbox.events import OutboxEvent
from dibs.outbox.publishers import Publisher, publisher_for


def write_atomically(path: Path, text: str) -> None:
    """The file appears whole or not at all."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


class Steered(Publisher):
    """The real publisher, with the hooks above around it."""

    def __init__(self, inner: Publisher, options: argparse.Namespace) -> None:
        self.inner = inner
        self.options = options
        self.description = inner.description
        self.batches = 0

    async def connect(self) -> None:
        await self.inner.connect()
        if self.options.ready:
            write_atomically(Path(self.options.ready), str(os.getpid()))

    async def publish(self, events: Sequence[OutboxEvent]) -> list[BaseException | None]:
        ids = json.dumps([event.id for event in events])
        if self.options.slow or self.options.jitter:
            if self.options.publishing:
                write_atomically(Path(self.options.publishing), ids)
            await asyncio.sleep(self.options.slow + random.uniform(0, self.options.jitter))
        outcomes = await self.inner.publish(events)
        self.batches += 1
        if self.batches == self.options.freeze_after:
            write_atomically(Path(self.options.frozen), ids)
            await asyncio.sleep(3600)  # hangs until killed
        return outcomes

    async def close(self) -> None:
        await self.inner.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("db_url")
    parser.add_argument("publisher_url")
    parser.add_argument("--name", required=True)
    parser.add_argument("--ready")
    parser.add_argument("--stats")
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--grace", type=float, default=5.0)
    parser.add_argument("--slow", type=float, default=0.0)
    parser.add_argument("--jitter", type=float, default=0.0)
    parser.add_argument("--publishing")
    parser.add_argument("--freeze-after", type=int, default=0)
    parser.add_argument("--frozen")
    options = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    outbox = dibs.Outbox(dibs.create_engine(options.db_url))
    relay = outbox.relay(
        Steered(publisher_for(options.publisher_url), options),
        name=options.name,
        batch=options.batch,
        concurrency=options.concurrency,
        lease=options.lease,
        grace=options.grace,
        poll=0.05,
        upkeep_every=0.1,
    )
    try:
        stats = relay.run()  # SIGTERM and SIGINT stop it gracefully
    finally:
        outbox.engine.dispose()
    if options.stats:
        write_atomically(Path(options.stats), json.dumps(dataclasses.asdict(stats)))


if __name__ == "__main__":
    main()
