"""The README's main-job command, run as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_the_demo_drains_a_mixed_workload_and_its_checks_hold(tmp_path: Path) -> None:
    dibs_command = Path(sys.executable).with_name("dibs")
    result = subprocess.run(
        [str(dibs_command), "demo", "--jobs", "400", "--workers", "3", "--file", str(tmp_path / "demo.sqlite")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Every job reached a final state; none was lost and none ran twice at once." in output
    assert "Runs of one job that overlapped in time: 0." in output
    assert "started before their time: 0" in output
    assert "Customers whose charges ran out of order or two at once: 0 of" in output
    assert "was killed in the middle of" in output
    assert "Dead letters keep their last error and traceback" in output
