"""Enqueue throughput: dibs beside the raw-SQL floors and the peers, in batch and one job at a time.

One process puts N jobs in, each with the same small arguments (``benchmarks.payload``), and the time of
that alone is measured (schemas, connections and emptying the tables come before the clock starts); after
every trial the system's table must hold exactly N jobs, or the run stops. Trials alternate between
systems within each round so that drift on a noisy machine hits all of them; medians are reported.

* ``dibs``: ``enqueue_many`` (one call) and ``enqueue`` (one call per job) on an Engine; ``dibs-tx``: the
  same with ``conn=`` in a caller's transaction (one for the batch, one per job).
* ``raw-insert``: the floor, the bare driver writing the same rows into ``dibs_jobs``: ``INSERT ... SELECT
  FROM unnest(array)`` on PostgreSQL, multi-row VALUES elsewhere; one autocommitted INSERT per job.
  ``raw-copy``: psycopg's ``COPY`` (PostgreSQL, batch only).
* ``pgqueuer``, ``procrastinate`` (PostgreSQL), ``huey`` (SQLite, one at a time: it has no bulk call) and,
  where Node is installed, ``graphile-worker`` (``addJobs`` / ``addJob``) and ``pg-boss`` (``insert`` /
  ``send``), each in a database of its own.

    python -m benchmarks.enqueue                                     # everything, about ten minutes
    python -m benchmarks.enqueue --backends sqlite --batch-jobs 5000 --one-jobs 500 --repeats 1
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import enqueuers, payload, record
from benchmarks.drain import BACKENDS, POSTGRES_URL, RESULTS, own_database, urls
from benchmarks.peers import node

SYSTEMS = (
    "dibs",
    "dibs-tx",
    "raw-insert",
    "raw-copy",
    "pgqueuer",
    "procrastinate",
    "huey",
    "graphile-worker",
    "pg-boss",
)
ON = {
    "raw-copy": ("postgresql",),
    "pgqueuer": ("postgresql",),
    "procrastinate": ("postgresql",),
    "huey": ("sqlite",),
    "graphile-worker": ("postgresql",),
    "pg-boss": ("postgresql",),
}
MODES = {"raw-copy": ("batch",), "huey": ("one",)}
DATABASE = os.environ.get("DIBS_BENCH_ENQUEUE_DATABASE", "dibs_bench_enqueue")
PACKAGES = ("sqlalchemy", "psycopg", "pymysql", "orjson", "pgqueuer", "asyncpg", "uvloop", "procrastinate", "huey")
#: The issue's goals: dibs against a floor or a peer, at least this ratio.
GOALS = [
    ("batch", "postgresql", "raw-copy", 0.5),
    ("batch", "postgresql", "graphile-worker", 2.0),
    ("batch", "sqlite", "raw-insert", 0.7),
    ("batch", "mariadb", "raw-insert", 0.7),
    ("one", "postgresql", "raw-insert", 0.8),
    ("one", "postgresql", "pgqueuer", 1.2),
    ("one", "sqlite", "raw-insert", 0.8),
    ("one", "mariadb", "raw-insert", 0.8),
]


def make(system: str, backend: str, url: str, payload_file: Any) -> Any:
    server = POSTGRES_URL if backend == "postgresql" else url
    if system in ("dibs", "dibs-tx"):
        return enqueuers.Dibs(backend, url, in_transaction=system == "dibs-tx")
    if system in ("raw-insert", "raw-copy"):
        return enqueuers.Raw(backend, url, copy=system == "raw-copy")
    if system in ("graphile-worker", "pg-boss"):
        return enqueuers.Node(system, server, payload_file)
    return {"pgqueuer": enqueuers.Pgqueuer, "procrastinate": enqueuers.Procrastinate, "huey": enqueuers.Huey}[system](
        backend, server
    )


def trial(system: str, enqueuer: Any, mode: str, payloads: list[dict[str, Any]]) -> tuple[float, float | None]:
    """Seconds to enqueue ``payloads`` (the Node drivers time themselves) and this process's CPU seconds
    meanwhile (None for the Node drivers, whose work is in another process); checks the count afterwards."""
    enqueuer.empty()
    began, cpu = time.perf_counter(), time.process_time()
    timed = enqueuer.enqueue(mode, payloads)
    seconds = time.perf_counter() - began if timed is None else timed
    used = time.process_time() - cpu if timed is None else None
    found = enqueuer.count()
    if found != len(payloads):
        raise RuntimeError(f"{system} {mode}: enqueued {len(payloads)} jobs, found {found}")
    return float(seconds), used


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="of " + ", ".join(SYSTEMS))
    parser.add_argument("--batch-jobs", type=int, default=50_000, help="jobs per batch trial (0: no batch trials)")
    parser.add_argument("--one-jobs", type=int, default=5_000, help="jobs per one-at-a-time trial (0: none)")
    parser.add_argument("--repeats", type=int, default=3, help="trials per system and mode; the median is kept")
    parser.add_argument("--gc", action="store_true", help="gc.freeze() before the trials (every Python system alike)")
    return parser


def run(argv: list[str] | None = None) -> dict[str, Any]:
    options = arguments().parse_args(argv)
    wanted = options.systems.split(",")
    absent = node.missing()
    if absent and {"graphile-worker", "pg-boss"} & set(wanted):
        print(f"  note: {absent}", flush=True)
        wanted = [system for system in wanted if system not in node.DRIVERS]
    sizes = {"batch": options.batch_jobs, "one": options.one_jobs}
    trials: list[dict[str, Any]] = []
    steps: dict[str, dict[str, float]] = {}
    versions: dict[str, str] = record.versions(PACKAGES)
    with tempfile.TemporaryDirectory() as tmp:
        files: dict[int, str] = {}

        def payload_file(jobs: int) -> str:
            if jobs not in files:
                files[jobs] = str(Path(tmp) / f"payloads-{jobs}.json")
                Path(files[jobs]).write_text(json.dumps(payload.many(jobs)))
            return files[jobs]

        for backend in options.backends.split(","):
            own_database(backend, create=True, database=DATABASE)
            url = urls(Path(tmp), DATABASE)[backend]
            systems = [system for system in wanted if backend in ON.get(system, BACKENDS)]
            made = {system: make(system, backend, url, payload_file) for system in systems}
            payloads = {mode: payload.many(size) for mode, size in sizes.items()}
            if options.gc:
                gc.freeze()
            for mode in [mode for mode in ("batch", "one") if sizes[mode] > 0]:
                for round_ in range(options.repeats):
                    for system in systems:
                        if mode not in MODES.get(system, ("batch", "one")):
                            continue
                        seconds, cpu = trial(system, made[system], mode, payloads[mode])
                        jobs = sizes[mode]
                        trials.append({"backend": backend, "system": system, "mode": mode, "jobs": jobs,
                                       "seconds": seconds, "cpu_seconds": cpu, "round": round_})  # fmt: skip
                        print(f"  {backend:<10} {mode:<5} {system:<15} {jobs / seconds:>10,.0f} jobs/s", flush=True)
            if "dibs" in made and sizes["batch"] > 0:
                steps[backend] = dibs_steps(made["dibs"], payloads["batch"], options.repeats)
            for enqueuer in made.values():
                versions.update(getattr(enqueuer, "versions", {}))
                enqueuer.close()
            if options.gc:
                gc.unfreeze()
            own_database(backend, create=False, database=DATABASE)
    summary = summarize(trials)
    result = {"benchmark": "enqueue", "options": vars(options), "versions": versions, "node_missing": absent,
              "trials": trials, "summary": summary, "goals": goals(summary), "steps": steps}  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"enqueue-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2))
    report(summary, result["goals"], steps)
    print(f"written to {out}")
    return result


def dibs_steps(enqueuer: enqueuers.Dibs, payloads: list[dict[str, Any]], repeats: int) -> dict[str, float]:
    """The median CPU microseconds per job of each step of dibs's batch enqueue (see ``Dibs.steps``)."""
    measured = [enqueuer.steps(payloads) for _ in range(repeats)]
    return {step: statistics.median(found[step] for found in measured) for step in measured[0]}


def summarize(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The median jobs/s of each backend, mode and system, its median CPU microseconds per job in this
    process (None for the Node drivers), and its ratio to each floor measured beside it."""
    groups: dict[tuple[str, str, str], list[float]] = {}
    cpu: dict[tuple[str, str, str], list[float]] = {}
    for found in trials:
        key = (found["backend"], found["mode"], found["system"])
        groups.setdefault(key, []).append(found["jobs"] / found["seconds"])
        if found.get("cpu_seconds") is not None:
            cpu.setdefault(key, []).append(found["cpu_seconds"] / found["jobs"] * 1e6)
    medians = {key: statistics.median(values) for key, values in groups.items()}
    summary = []
    for (backend, mode, system), rate in medians.items():
        used = cpu.get((backend, mode, system))
        row: dict[str, Any] = {"backend": backend, "mode": mode, "system": system, "jobs_per_second": rate,
                               "cpu_us_per_job": statistics.median(used) if used else None}  # fmt: skip
        for floor in ("raw-insert", "raw-copy"):
            if (backend, mode, floor) in medians:
                row[f"vs_{floor}"] = rate / medians[backend, mode, floor]
        summary.append(row)
    return summary


def goals(summary: list[dict[str, Any]]) -> list[str]:
    rates = {(row["backend"], row["mode"], row["system"]): row["jobs_per_second"] for row in summary}
    lines = []
    for mode, backend, other, goal in GOALS:
        for system in ("dibs", "dibs-tx"):
            if (backend, mode, system) in rates and (backend, mode, other) in rates:
                ratio = rates[backend, mode, system] / rates[backend, mode, other]
                met = "met" if ratio >= goal else "not met"
                lines.append(f"{system} {mode} on {backend}: {ratio:.2f}x {other} (goal >= {goal}x: {met})")
    return lines


def report(summary: list[dict[str, Any]], lines: list[str], steps: dict[str, dict[str, float]]) -> None:
    print("\n== enqueue, median jobs/s, CPU us per job in the enqueuing process (ratio to raw-insert, raw-copy)")
    for row in summary:
        ratios = ", ".join(f"{row[key]:.2f}x" for key in ("vs_raw-insert", "vs_raw-copy") if key in row)
        cpu = "-" if row["cpu_us_per_job"] is None else f"{row['cpu_us_per_job']:.1f}"
        print(f"  {row['backend']:<10} {row['mode']:<5} {row['system']:<15} {row['jobs_per_second']:>10,.0f} "
              f"{cpu:>7}  {ratios}")  # fmt: skip
    for backend, found in steps.items():
        parts = ", ".join(f"{step.replace('_', ' ')} {value:.1f}" for step, value in found.items())
        print(f"  dibs batch on {backend}, CPU us per job: {parts}")
    for line in lines:
        print(f"  goal: {line}")


def main(argv: list[str] | None = None) -> None:
    run(argv)


if __name__ == "__main__":
    main()
