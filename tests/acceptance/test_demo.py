"""The README's main-job command, run as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_the_demo_finishes_every_task_exactly_once(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dibs.demo", "--tasks", "300", "--workers", "3", "--db", str(tmp_path / "demo.sqlite")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Tasks finished by two workers: 0.  Tasks lost: 0." in result.stdout
    assert "Every task was finished exactly once." in result.stdout
    assert "20 tasks were held by the crashed worker" in result.stdout
