"""pg-boss (Node) on PostgreSQL, in its fastest documented loop: ``fetch`` a batch, ``complete`` its ids.

Its driver, ``pg_boss.js``, runs that loop on a pool of 2 connections until a fetch finds nothing, with the
supervisor and the scheduler off (they archive and expire, neither of which a drain of a few seconds needs).
pg-boss keeps a completed job in ``pgboss.job`` with its state and times, which ``verify`` checks.
"""

from __future__ import annotations

from typing import Any

from benchmarks.peers import node

NAME = "pg-boss"
BACKENDS = ("postgresql",)
PACKAGES = ()
SETTINGS = [{"batch": 500}, {"batch": 1000}]


def label(setting: dict[str, Any]) -> str:
    return f"b{setting['batch']}"


def parse(text: str) -> list[dict[str, Any]]:
    """``100,500``: fetch batch sizes."""
    return [{"batch": int(item)} for item in text.split(",")]


def drain(address: str, setting: dict[str, Any], start: Any) -> tuple[int, float, dict[str, Any]]:
    return node.drain(NAME, address, setting, start)


class Database(node.Database):
    def __init__(self, backend: str, server_url: str) -> None:
        super().__init__(
            NAME,
            backend,
            server_url,
            "SELECT state::text, count(*) FROM pgboss.job GROUP BY state",
            "SELECT extract(epoch FROM max(completed_on) - min(started_on)) FROM pgboss.job",
        )

    def verify(self, jobs: int) -> float:
        found, span = self.found()
        if found != {"completed": jobs}:
            raise RuntimeError(f"pg-boss: expected {jobs} jobs completed, found {found}")
        return span
