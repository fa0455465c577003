"""Running the dibs command as a user types it: the installed script, the test app, and events to relay."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dibs import Outbox

#: The dibs command installed beside this Python, the test app, and where the command runs.
DIBS = str(Path(sys.executable).with_name("dibs"))
APP = "tests.acceptance.cli_app:app"
ROOT = Path(__file__).resolve().parents[2]


def dibs(database: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DIBS_DATABASE_URL": database, "DIBS_CLI_TEST_OUT": str(tmp_path / "out.txt")}
    return subprocess.run(
        [DIBS, *args],
        capture_output=True,
        stdin=subprocess.DEVNULL,  # as from a script: no terminal to ask on
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
        env={**env, "COLUMNS": "200"},
    )


def add_events(database: str, count: int) -> list[int]:
    outbox = Outbox(database)
    try:
        with outbox.engine.begin() as conn:
            return outbox.add_many(
                conn,
                [
                    {
                        "aggregate_type": "order",
                        "aggregate_id": n % 3,
                        "event_type": "order.placed",
                        "payload": {"n": n},
                    }
                    for n in range(count)
                ],
            )
    finally:
        outbox.engine.dispose()
