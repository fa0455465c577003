"""An app with a periodic job, for the command-line test: `dibs worker tests.queue.periodic_app:app`.

Its database is ``$DIBS_DATABASE_URL``; each run of ``heartbeat`` appends a line to ``$DIBS_PERIODIC_TEST_OUT``.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import dibs

app = dibs.App()


@app.periodic(every=timedelta(seconds=1), name="heartbeat", args={"note": "beat"})
@app.task(name="beat")
def beat(note: str) -> None:
    with Path(os.environ["DIBS_PERIODIC_TEST_OUT"]).open("a") as out:
        out.write(f"{note}\n")
