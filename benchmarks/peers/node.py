"""The Node peers (graphile-worker, pg-boss): their drivers are small scripts beside this module, run by ``node``.

``scripts/lib/node.sh`` installs the packages into ``benchmarks/node_peers`` from the npm registry. Each driver
does its own timing and prints one JSON line: the seconds measured, what it found in its tables afterwards and
the versions of the package and of Node. Every trial gets a fresh database, so a driver installs its schema
before its clock starts and never sees an earlier trial's rows.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

HERE = Path(__file__).parent
FOLDER = Path(os.environ.get("DIBS_NODE_PEERS", HERE.parent / "node_peers"))
#: The kind's name in the results, and its driver script.
DRIVERS = {"graphile-worker": "graphile_worker.js", "pg-boss": "pg_boss.js"}
PACKAGES = {"graphile-worker": "graphile-worker@0.17", "pg-boss": "pg-boss@10"}


def missing() -> str | None:
    """Why the Node peers cannot run here, or None when they can."""
    if shutil.which("node") is None:
        return "Node.js is not installed (no `node` on PATH): graphile-worker and pg-boss are left out"
    absent = [name for name in DRIVERS if not (FOLDER / "node_modules" / name / "package.json").is_file()]
    if absent:
        return f"{', '.join(absent)} not installed in {FOLDER}: run scripts/bench (scripts/lib/node.sh installs them)"
    return None


def fresh_database(server_url: str, name: str) -> str:
    """An empty PostgreSQL database ``name`` on the server of ``server_url``; returns its libpq URL."""
    import psycopg

    server = sa.make_url(server_url).set(drivername="postgresql")
    with psycopg.connect(server.set(database="postgres").render_as_string(hide_password=False)) as admin:
        admin.autocommit = True
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {name}")
    return server.set(database=name).render_as_string(hide_password=False)


def drop_database(server_url: str, name: str) -> None:
    import psycopg

    server = sa.make_url(server_url).set(drivername="postgresql", database="postgres")
    with psycopg.connect(server.render_as_string(hide_password=False)) as admin:
        admin.autocommit = True
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def run(kind: str, command: str, *arguments: str, timeout: float = 900) -> dict[str, Any]:
    """Run ``kind``'s driver with ``command`` and its arguments; returns the JSON line it printed."""
    found = subprocess.run(
        ["node", str(HERE / DRIVERS[kind]), command, *arguments],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "DIBS_NODE_PEERS": str(FOLDER)},
        check=False,
    )
    if found.returncode != 0:
        raise RuntimeError(f"{kind} {command} failed ({found.returncode}): {found.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(found.stdout.strip().splitlines()[-1])
    return result


class Database:
    """A Node peer's database of its own: its schema installed by its driver, refilled through its own bulk
    call before each trial, checked after. ``verify`` runs ``checks`` (the SQL of what a finished drain leaves)
    and compares it with ``expected(jobs)``."""

    def __init__(self, kind: str, backend: str, server_url: str, checks: str, span: str | None) -> None:
        if backend != "postgresql":
            raise ValueError(f"{kind} runs on postgresql, not {backend}")
        self.kind, self.server_url, self.checks, self.span = kind, server_url, checks, span
        self.name = "dibs_bench_" + kind.replace("-", "_")
        self.dsn = fresh_database(server_url, self.name)
        self.version = run(kind, "install", self.dsn)["version"]
        self.folder = tempfile.TemporaryDirectory()

    def address(self) -> str:
        return self.dsn

    def refill(self, jobs: int) -> None:
        from benchmarks import payload

        path = Path(self.folder.name) / f"payloads-{jobs}.json"
        if not path.exists():
            path.write_text(json.dumps(payload.many(jobs)))
        run(self.kind, "fill", self.dsn, str(path))

    def found(self) -> tuple[dict[str, int], float]:
        import psycopg

        with psycopg.connect(self.dsn) as conn:
            found = {str(state): int(count) for state, count in conn.execute(self.checks)}
            span = conn.execute(self.span).fetchone() if self.span else None
        return found, float("nan") if span is None or span[0] is None else float(span[0])

    def close(self) -> None:
        self.folder.cleanup()
        drop_database(self.server_url, self.name)


def drain(kind: str, address: str, setting: dict[str, Any], start: Any) -> tuple[int, float, dict[str, Any]]:
    """Run ``kind``'s drain driver: it opens its connections and says it is ready, waits for a line on its
    stdin, which it gets once ``start`` is passed, and prints the jobs its handler ran when the queue is empty."""
    process = subprocess.Popen(
        ["node", str(HERE / DRIVERS[kind]), "drain", address, json.dumps(setting)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "DIBS_NODE_PEERS": str(FOLDER)},
    )
    assert process.stdin is not None
    assert process.stdout is not None
    if not json.loads(process.stdout.readline() or "{}").get("ready"):
        process.kill()
        raise RuntimeError(f"{kind} drain did not start (exit {process.wait()})")
    start.wait()
    process.stdin.write("go\n")
    process.stdin.flush()
    line = process.stdout.readline()
    end = time.monotonic()
    if process.wait(timeout=60) != 0 or not line:
        raise RuntimeError(f"{kind} drain failed (exit {process.returncode})")
    result = json.loads(line)
    return int(result["done"]), end, {"child_cpu_seconds": result["cpu_seconds"], kind: result["version"]}


def latency(kind: str, server_url: str, rate: float, seconds: float) -> dict[str, Any]:
    """Pickup latency of ``kind``'s running worker fed by its own producer at ``rate`` jobs a second, in a
    fresh database; the same shape as the drain's dibs latency (milliseconds, from the producer's clock
    just before its call to the start of the handler)."""
    name = "dibs_bench_latency_" + kind.replace("-", "_")
    dsn = fresh_database(server_url, name)
    total = round(rate * seconds)
    script = str(HERE / DRIVERS[kind])
    env = {**os.environ, "DIBS_NODE_PEERS": str(FOLDER)}
    try:
        run(kind, "install", dsn)
        worker, producer = (
            subprocess.Popen(
                ["node", script, *arguments], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
            )
            for arguments in (["latency-worker", dsn, str(total)], ["latency-producer", dsn, str(rate), str(total)])
        )
        for process in (worker, producer):
            assert process.stdin is not None
            assert process.stdout is not None
            if not json.loads(process.stdout.readline() or "{}").get("ready"):
                raise RuntimeError(f"{kind} latency: a driver did not start")
        for process in (worker, producer):
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        assert producer.stdout is not None
        assert worker.stdout is not None
        sent = json.loads(producer.stdout.readline())
        found = json.loads(worker.stdout.readline())
        worker.wait(timeout=60)
        producer.wait(timeout=60)
    finally:
        drop_database(server_url, name)
    waits = sorted(found["waits"])
    if len(waits) != total:
        raise RuntimeError(f"{kind} latency: the worker started {len(waits)} of {total} jobs")

    def at(fraction: float) -> float:
        return float(waits[min(len(waits) - 1, round(fraction * (len(waits) - 1)))])

    return {
        "kind": kind,
        "offered_rate": rate,
        "jobs": total,
        "producers": 1,
        "achieved_rate": total / sent["seconds"],
        "p50_ms": at(0.50),
        "p95_ms": at(0.95),
        "p99_ms": at(0.99),
        "max_ms": waits[-1],
        "version": found["version"],
    }
