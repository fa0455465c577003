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
