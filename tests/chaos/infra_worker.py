"""A recording queue worker in a process of its own, for the infrastructure scenarios.

    python -m tests.chaos.infra_worker DB_URL --history DIR --actor NAME [--concurrency N] [--batch N]
        [--lease S] [--sqlite-timeout S] [--no-notify] [--ready FILE] [--stats FILE]

It runs the tasks of :mod:`tests.chaos.recording` until SIGTERM (graceful) and appends its history to
``DIR/NAME.jsonl``. ``--ready`` appears once the worker started; ``--stats`` gets its WorkerStats (JSON) once
it stopped. ``--sqlite-timeout`` sets SQLite's busy timeout (short: writers meet ``dibs.Busy`` often).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

import dibs
from tests.chaos.history import Recorder
from tests.chaos.recording import recording_app


def write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("db_url")
    parser.add_argument("--history", required=True)
    parser.add_argument("--actor", required=True)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--lease", type=float, default=3.0)
    parser.add_argument("--sqlite-timeout", type=float, default=None)
    parser.add_argument("--no-notify", action="store_true")
    parser.add_argument("--ready")
    parser.add_argument("--stats")
    options = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    engine_options: dict[str, Any] = {}
    if options.sqlite_timeout is not None:
        engine_options["connect_args"] = {"timeout": options.sqlite_timeout}
    engine = dibs.create_engine(options.db_url, **engine_options)
    recorder = Recorder(Path(options.history), options.actor)
    app = recording_app(engine, recorder, notify=not options.no_notify)
    worker = dibs.Worker(
        app,
        concurrency=options.concurrency,
        batch=options.batch,
        lease=options.lease,
        poll=0.05,
        upkeep_every=0.2,
        grace=10.0,
        name=options.actor,
    )
    if options.ready:
        ready = Path(options.ready)

        def announce() -> None:
            # Once the worker has started: its tables checked, about to claim.
            while not worker.ready.wait(0.02) and not worker.stopping:
                pass
            write_atomically(ready, str(os.getpid()))

        threading.Thread(target=announce, daemon=True).start()
    try:
        stats = worker.run()  # SIGTERM and SIGINT stop it gracefully
    finally:
        engine.dispose()
        recorder.close()
    if options.stats:
        write_atomically(Path(options.stats), json.dumps(dataclasses.asdict(stats)))


if __name__ == "__main__":
    main()
