"""The benchmark runner's enqueue part and the Node peers' drivers run end to end on a tiny workload.

Run as a user runs them (``python -m benchmarks``, ``node benchmarks/peers/*.js``), with the results
written to a temporary folder so that they never join the published ones.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.targets import IN_CI

ROOT = Path(__file__).parent.parent.parent
TINY = "--batch-jobs 300 --one-jobs 20 --repeats 1"
PYTHON_PEERS = {"pgqueuer": "pgqueuer", "procrastinate": "procrastinate", "huey": "huey"}


def node_peers() -> None:
    """Node and the Node peers, installed as scripts/bench installs them; skip (fail in CI) without Node."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        if IN_CI:
            pytest.fail("Node.js (node and npm) is missing: the Node peers' benchmark drivers cannot be tested")
        pytest.skip("Node.js (node and npm) is not installed: the Node peers' drivers are not tested")
    subprocess.run(["bash", "-c", ". scripts/lib/node.sh && dibs_node_peers"], cwd=ROOT, check=True, timeout=300)


def runner(tmp_path: Path, arguments: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", "--plots", str(tmp_path / "plots"), *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DIBS_BENCH_RESULTS": str(tmp_path), **env},
        check=False,
    )


def test_the_enqueue_part_measures_every_system_on_every_backend(tmp_path: Path) -> None:
    node_peers()
    systems = ["dibs", "dibs-tx", "raw-insert", "raw-copy", "graphile-worker", "pg-boss"]
    systems += [name for name, module in PYTHON_PEERS.items() if importlib.util.find_spec(module) is not None]
    found = runner(tmp_path, ["--parts", "enqueue", "--enqueue-args", f"{TINY} --systems {','.join(systems)}"])
    assert found.returncode == 0, found.stderr[-3000:]
    (enqueue,) = tmp_path.glob("enqueue-*.json")
    result = json.loads(enqueue.read_text())
    measured = {(row["backend"], row["mode"], row["system"]) for row in result["summary"]}
    for system in systems:
        assert any(key[2] == system for key in measured), f"{system} was not measured: {sorted(measured)}"
    for backend in ("postgresql", "sqlite", "mariadb"):
        for mode in ("batch", "one"):
            assert (backend, mode, "dibs") in measured
            assert (backend, mode, "raw-insert") in measured
    for backend in ("postgresql", "sqlite", "mariadb"):  # dibs's batch, step by step, in CPU time per job
        steps = result["steps"][backend]
        assert set(steps) == {"check_and_encode", "insert", "make_jobs", "whole"}
        assert 0 < steps["check_and_encode"] < steps["whole"]
        assert 0 < steps["make_jobs"] < steps["whole"]
    assert all(row["cpu_us_per_job"] > 0 for row in result["summary"] if row["system"] in ("dibs", "raw-insert"))
    assert result["versions"]["graphile-worker"].startswith("0.17.")
    assert result["versions"]["pg-boss"].startswith("10.")
    assert any(line.startswith("enqueue: dibs batch on postgresql") for line in json.loads(
        next(tmp_path.glob("run-*.json")).read_text())["goals"])  # fmt: skip


def test_the_run_says_plainly_when_the_node_peers_are_missing(tmp_path: Path) -> None:
    arguments = f"{TINY} --backends postgresql --systems dibs,graphile-worker,pg-boss"
    found = runner(tmp_path, ["--parts", "enqueue", "--enqueue-args", arguments], DIBS_NODE_PEERS=str(tmp_path))
    assert found.returncode == 0, found.stderr[-3000:]
    assert "graphile-worker, pg-boss not installed" in found.stdout
    result = json.loads(next(tmp_path.glob("enqueue-*.json")).read_text())
    assert result["node_missing"]
    assert {row["system"] for row in result["summary"]} == {"dibs"}


def test_the_node_peers_drain_and_start_jobs_beside_dibs(tmp_path: Path) -> None:
    node_peers()
    arguments = (
        "--backends postgresql --processes 1 --repeats 1 --configs 1000x500 --jobs 500 "
        "--kinds graphile-worker,pg-boss --latency-rates 100 --latency-seconds 1"
    )
    found = runner(
        tmp_path, ["--parts", "drain", "--drain-args", arguments], DIBS_BENCH_DATABASE="dibs_bench_drain_test"
    )
    assert found.returncode == 0, found.stderr[-3000:]
    result = json.loads(next(tmp_path.glob("drain-*.json")).read_text())
    drained = {(trial["kind"], trial["setting"]) for trial in result["trials"]}
    assert drained == {("graphile-worker", "j24/q500"), ("graphile-worker", "j48/q1000"), ("pg-boss", "b500"),
                       ("pg-boss", "b1000")}  # fmt: skip
    assert [entry["kind"] for entry in result["latency"]] == ["dibs", "graphile-worker", "pg-boss"]
    assert all(entry["jobs"] == 100 and entry["p50_ms"] > 0 for entry in result["latency"])
