"""A test's helper program in an OS process of its own, with its output, readiness and stats in files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class ScriptProcess:
    """``python -m MODULE ARGUMENTS... --ready FILE --stats FILE`` started from the repository's root; its output
    goes to ``DIRECTORY/NAME.log``. The program touches the ready file once it runs and writes its stats as
    JSON when it stops."""

    #: What the program is, in messages.
    kind = "process"

    def __init__(self, directory: Path, name: str, module: str, *arguments: str) -> None:
        self.directory = directory
        self.name = name
        directory.mkdir(parents=True, exist_ok=True)
        self.log = directory / f"{name}.log"
        self.ready = directory / f"{name}.ready"
        self.stats_file = directory / f"{name}.stats"
        command = [
            sys.executable, "-m", module, *arguments, "--ready", str(self.ready), "--stats", str(self.stats_file)
        ]  # fmt: skip
        environment = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        with self.log.open("wb") as output:
            self.process = subprocess.Popen(command, cwd=ROOT, env=environment, stdout=output, stderr=subprocess.STDOUT)

    def alive(self) -> bool:
        return self.process.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def terminate(self) -> None:
        if self.alive():
            self.process.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        if self.alive():
            self.process.send_signal(signal.SIGKILL)

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.kind} {self.name} did not exit within {timeout} s:\n{self.output()}") from None

    def stats(self) -> dict[str, int]:
        """What the program did, as it wrote when it stopped."""
        data: dict[str, int] = json.loads(self.stats_file.read_text())
        return data

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
