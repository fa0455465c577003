"""An app as a user writes one, for the command-line tests: `dibs worker tests.acceptance.cli_app:app`."""

from __future__ import annotations

import os
import time
from pathlib import Path

import dibs

app = dibs.App(queues=["spare"])


@app.task(name="greet")
def greet(name: str) -> None:
    with Path(os.environ["DIBS_CLI_TEST_OUT"]).open("a") as out:
        out.write(f"hello {name}\n")


@app.task(name="explode", max_attempts=1)
def explode() -> None:
    raise RuntimeError("this job always fails")


@app.task(name="sleepy")
def sleepy(seconds: float) -> None:
    Path(os.environ["DIBS_CLI_TEST_OUT"]).touch()
    time.sleep(seconds)  # does not look at its context: only the end of the process stops it
