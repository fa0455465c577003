"""A worker with a periodic job, in a process of its own, for the exactly-once-per-slot tests.

    python -m tests.queue.periodic_process URL NAME

The app's periodic job ``ticks`` (every second) enqueues ``tests.tick`` jobs on the queue ``ticks``,
whose arguments say which scheduler enqueued them (``{"by": NAME}``). The worker serves the queue
``default`` only, so the tick jobs stay queued with their dedupe keys, from which the test reads their
slots. It prints ``ready`` before it starts and stops on SIGTERM.
"""

from __future__ import annotations

import argparse
from datetime import timedelta

import dibs

#: The periodic job every scheduler of the test runs.
TICKS = "ticks"
EVERY = timedelta(seconds=1)


def add_ticks(app: dibs.App, by: str) -> dibs.App:
    """Register the test's tasks on ``app``: the periodic ``tests.tick`` and an idle task on ``default``."""

    @app.periodic(every=EVERY, name=TICKS, args={"by": by})
    @app.task(name="tests.tick", queue="ticks")
    def tick(by: str) -> None: ...

    @app.task(name="tests.idle")
    def idle() -> None: ...

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("name")
    options = parser.parse_args()
    app = add_ticks(dibs.App(dibs.create_engine(options.url)), options.name)
    worker = dibs.Worker(app, queues=["default"], lease=2.0, poll=0.05, upkeep_every=0.02, grace=2.0)
    print("ready", flush=True)
    try:
        worker.run()
    finally:
        app.engine.dispose()


if __name__ == "__main__":
    main()
