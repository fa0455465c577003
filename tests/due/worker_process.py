"""A due scheduler worker in a process of its own, for the tests of many workers and of a killed one.

    python -m tests.due.worker_process URL --log PATH [--result PATH] [--owner NAME] [--lease S]
        [--sleep S] [--concurrency N] [--max-sources N] [--ready PATH --go PATH] [--block]

It runs ``DueScheduler.run`` over the sources table (an interval of an hour) until nothing is due (a run
that claims nothing while rows are still due, locked by another worker's claim, is tried again). Its
handler sleeps ``--sleep`` seconds and appends one JSON line per run to ``--log`` (source, worker, lease
token, start and end on the wall clock). With ``--block`` the handler writes that line at its start and then
sleeps for good, for the test to kill it. With ``--ready`` it touches that file and waits for ``--go`` to
exist before it claims anything, so that several workers start at once. ``--result`` receives its
totals as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import dibs
from tests.due.support import HOUR, sources_table


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--result", type=Path)
    parser.add_argument("--owner", default=None)
    parser.add_argument("--lease", type=float, default=5.0)
    parser.add_argument("--sleep", type=float, default=0.005)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--max-sources", type=int, default=20)
    parser.add_argument("--ready", type=Path)
    parser.add_argument("--go", type=Path)
    parser.add_argument("--block", action="store_true")
    options = parser.parse_args()

    owner = options.owner or f"worker-{os.getpid()}"
    engine = dibs.create_engine(options.url)
    scheduler = dibs.DueScheduler(
        sources_table(),
        last_run="last_run_at",
        interval=HOUR,
        enabled="enabled",
        priority="priority",
        lease=options.lease,
    )
    lock = threading.Lock()

    def record(row: Any, start: float, end: float) -> None:
        line = json.dumps({"id": row.id, "worker": owner, "token": row.lease_token, "start": start, "end": end})
        with lock, options.log.open("a") as log:
            log.write(line + "\n")

    def handler(row: Any) -> None:
        start = time.time()
        if options.block:
            record(row, start, start)
            time.sleep(600)
        time.sleep(options.sleep)
        record(row, start, time.time())

    try:
        if options.ready is not None:
            options.ready.touch()
            deadline = time.monotonic() + 30
            while options.go is not None and not options.go.exists():
                if time.monotonic() > deadline:
                    raise SystemExit("no go within 30 s")
                time.sleep(0.005)
        totals = dibs.DueStats()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            stats = scheduler.run(
                engine, handler, max_sources=options.max_sources, concurrency=options.concurrency, owner=owner
            )
            for name in ("claimed", "succeeded", "failed", "lost"):
                setattr(totals, name, getattr(totals, name) + getattr(stats, name))
            totals.errors.update(stats.errors)
            if stats.claimed == 0:
                # Nothing claimed: done if nothing is due, else the due rows were locked by another
                # worker's claim in flight (MariaDB locks every due row a claim scans): try again.
                if not scheduler.due_rows(engine, limit=1):
                    break
                time.sleep(0.01)
        if options.result is not None:
            options.result.write_text(json.dumps(dataclasses.asdict(totals), default=str))
    finally:
        engine.dispose()


if __name__ == "__main__":
    main()
