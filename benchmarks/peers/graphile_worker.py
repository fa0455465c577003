"""graphile-worker (Node) on PostgreSQL, with the settings of its docs' performance page.

Its driver, ``graphile_worker.js``, runs ``run()`` with ``concurrentJobs`` 24, a ``localQueue`` of 500
jobs and job completions batched (``completeJobBatchDelay: 0``), on a pool of 10 connections (its default:
the page's 25 would need 200 connections at 8 processes); the second setting doubles the concurrency and the
local queue. graphile-worker deletes a job when it completes and has no
burst mode, so the driver stops the runner once the table is empty; ``verify`` checks that it is, and that
its handler ran every job (the drain compares the count). It keeps no times of its own: no span.
"""

from __future__ import annotations

from typing import Any

from benchmarks.peers import node

NAME = "graphile-worker"
BACKENDS = ("postgresql",)
PACKAGES = ()
SETTINGS = [{"jobs": 24, "local_queue": 500, "batch": 500}, {"jobs": 48, "local_queue": 1000, "batch": 1000}]


def label(setting: dict[str, Any]) -> str:
    return f"j{setting['jobs']}/q{setting['local_queue']}"


def parse(text: str) -> list[dict[str, Any]]:
    """``24/500,48/1000``: concurrentJobs/localQueue size pairs."""
    settings = []
    for item in text.split(","):
        jobs, size = item.split("/")
        settings.append({"jobs": int(jobs), "local_queue": int(size), "batch": int(size)})
    return settings


def drain(address: str, setting: dict[str, Any], start: Any) -> tuple[int, float, dict[str, Any]]:
    return node.drain(NAME, address, setting, start)


class Database(node.Database):
    def __init__(self, backend: str, server_url: str) -> None:
        super().__init__(NAME, backend, server_url, "SELECT 'left', count(*) FROM graphile_worker._private_jobs", None)

    def verify(self, jobs: int) -> float:
        found, span = self.found()
        if found != {"left": 0}:
            raise RuntimeError(f"graphile-worker: expected its jobs table empty after {jobs} jobs, found {found}")
        return span
