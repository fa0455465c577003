"""The drain's report: medians per setting, the best of each kind, the goals, written as JSON."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks import record
from benchmarks.drain_kinds import BACKENDS, KINDS, PEERS, Trial, peer
from benchmarks.latency import describe_latency

# -- the report ------------------------------------------------------------------------------------

#: The goals, as ratios from the same run: dibs's best over each peer's best at the same number of
#: processes, and over the raw floor at the same batch size.
PEER_GOALS = {"pgqueuer": 2.5, "procrastinate": 50.0, "huey": 10.0}
FLOOR_GOAL = 0.7


def median_of(trials: list[Trial], **match: Any) -> float | None:
    values = [t.jobs_per_second for t in trials if all(getattr(t, k) == v for k, v in match.items())]
    return statistics.median(values) if values else None


def summarize(trials: list[Trial]) -> list[dict[str, Any]]:
    """Per backend and process count: the best median of each kind, and dibs's ratios to the others."""
    summary = []
    for backend in dict.fromkeys(t.backend for t in trials):
        for processes in sorted({t.processes for t in trials if t.backend == backend}):
            row: dict[str, Any] = {"backend": backend, "processes": processes}
            for kind in KINDS:
                medians = {
                    t.setting: median_of(trials, backend=backend, processes=processes, kind=kind, setting=t.setting)
                    for t in trials
                    if (t.backend, t.processes, t.kind) == (backend, processes, kind)
                }
                if medians:
                    best = max(medians, key=lambda s: medians[s] or 0.0)
                    row[kind] = {"best": best, "jobs_per_second": medians[best], "all": medians}
            if "dibs" in row and "raw" in row:
                batch = next(t.batch for t in trials if t.kind == "dibs" and t.setting == row["dibs"]["best"])
                floor = median_of(trials, backend=backend, processes=processes, kind="raw", batch=batch)
                if floor:
                    row["raw_at_dibs_batch"] = {"setting": f"b{batch}", "jobs_per_second": floor}
                    row["dibs_over_raw"] = row["dibs"]["jobs_per_second"] / floor
            for kind in PEERS:
                if "dibs" in row and kind in row:
                    row[f"dibs_over_{kind}"] = row["dibs"]["jobs_per_second"] / row[kind]["jobs_per_second"]
            summary.append(row)
    return summary


def goals(summary: list[dict[str, Any]]) -> list[str]:
    """One line per goal and process count: the ratio, and met or MISSED."""
    lines = []
    for row in summary:
        where = f"{row['backend']} x{row['processes']}"
        if "dibs_over_raw" in row:
            ratio = row["dibs_over_raw"]
            lines.append(
                f"{where}: dibs {row['dibs']['jobs_per_second']:,.0f} ({row['dibs']['best']}) / raw floor at the same "
                f"batch {row['raw_at_dibs_batch']['jobs_per_second']:,.0f} = {ratio:.2f}; goal >= {FLOOR_GOAL}: "
                + ("met" if ratio >= FLOOR_GOAL else "MISSED")
            )
        for kind, goal in PEER_GOALS.items():
            if f"dibs_over_{kind}" in row:
                ratio = row[f"dibs_over_{kind}"]
                lines.append(
                    f"{where}: dibs / {kind} ({row[kind]['jobs_per_second']:,.0f}, {row[kind]['best']}) = "
                    f"{ratio:.2f}; goal >= {goal}: " + ("met" if ratio >= goal else "MISSED")
                )
    return lines


def versions(kinds: list[str]) -> dict[str, str]:
    packages = ["dibs", "sqlalchemy", "psycopg", "pymysql"]
    for kind in kinds:
        if kind in PEERS:
            packages.extend(peer(kind).PACKAGES)
    return record.versions(packages)


def report(
    trials: list[Trial],
    enqueue_rates: dict[str, float],
    latencies: list[dict[str, Any]],
    options: dict[str, Any],
    elapsed: float,
    load: dict[str, Any],
    results_dir: Path,
) -> dict[str, Any]:
    print("\nmedian jobs/s of each setting")
    print(
        f"{'backend':<11}{'procs':>6}  {'kind':<17}{'setting':<13}{'jobs':>8}{'median':>11}{'trials':>8}"
        f"{'CPU us/job':>12}"
    )
    seen = sorted(
        {(t.backend, t.processes, t.kind, t.batch, t.setting, t.jobs) for t in trials},
        key=lambda k: (BACKENDS.index(k[0]), k[1], KINDS.index(k[2]), k[3], k[4]),
    )
    for backend, processes, kind, _, setting, jobs in seen:
        match = {"backend": backend, "processes": processes, "kind": kind, "setting": setting}
        count = sum(1 for t in trials if all(getattr(t, k) == v for k, v in match.items()))
        middle = median_of(trials, **match) or 0.0
        cpu = statistics.median(t.cpu_us_per_job for t in trials if all(getattr(t, k) == v for k, v in match.items()))
        print(f"{backend:<11}{processes:>6}  {kind:<17}{setting:<13}{jobs:>8,}{middle:>11,.0f}{count:>8}{cpu:>12.0f}")

    summary = summarize(trials)
    print("\nbest median per kind; dibs/raw at dibs's best batch size, dibs/peer best against best")
    print(f"{'backend':<11}{'procs':>6}  " + "".join(f"{kind:>16}" for kind in KINDS) + "   ratios")
    for row in summary:
        cells = "".join(f"{row[kind]['jobs_per_second']:>16,.0f}" if kind in row else f"{'-':>16}" for kind in KINDS)
        ratios = ", ".join(
            f"/{kind} {row[f'dibs_over_{kind}']:.2f}" for kind in ("raw", *PEERS) if f"dibs_over_{kind}" in row
        )
        print(f"{row['backend']:<11}{row['processes']:>6}  {cells}   {ratios}")
    verdicts = goals(summary)
    print("\ngoals")
    for line in verdicts:
        print(f"  {line}")
    if latencies:
        print("\nenqueue-to-start latency on PostgreSQL")
        for result in latencies:
            print(f"  {describe_latency(result)}")
    print(f"\ndibs enqueue_many while filling: {', '.join(f'{b} {r:,.0f} jobs/s' for b, r in enqueue_rates.items())}")
    results = {
        "benchmark": "drain",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_average": load},
        "versions": versions(options["kinds"].split(",")),
        "options": options,
        "seconds": elapsed,
        "summary": summary,
        "goals": verdicts,
        "latency": latencies,
        "enqueue_many_jobs_per_second": enqueue_rates,
        "trials": [
            asdict(t) | {"jobs_per_second": t.jobs_per_second, "cpu_us_per_job": t.cpu_us_per_job} for t in trials
        ],
    }
    results_dir.mkdir(exist_ok=True)
    out = results_dir / f"drain-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"\nwritten to {out} after {elapsed / 60:.1f} minutes")
    return results
