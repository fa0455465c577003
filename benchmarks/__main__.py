"""All the benchmarks in one run: ``python -m benchmarks`` (or ``scripts/bench``, which installs what it needs).

In order: enqueue throughput, batch and one job at a time, of dibs, the raw-SQL floors and the peers
(``benchmarks.enqueue``); the drain of no-op jobs by dibs, the raw-SQL floor and the peers (pgqueuer and
procrastinate on PostgreSQL, huey on SQLite) with 1, 2, 4 and 8 worker processes on PostgreSQL, SQLite and MariaDB, with
pickup latency at fixed offered rates (``benchmarks.drain``); the claim cost as the backlog grows and as
finished rows accumulate (``benchmarks.backlog``); the outbox relay from PostgreSQL to Redis Streams
(``benchmarks.relay``). Each part writes its own JSON; this run writes one more, ``run-<time>.json``,
holding all of them with the machine and the goals, then draws the plots into docs/benchmarks/. It does not
rewrite docs/benchmarks.md, which quotes one complete run by hand, nor docs/benchmarks/history.md, which lists
every result file: update both when committing a run's results (tests/acceptance/test_docs_site.py checks).

    python -m benchmarks                           # everything, about an hour here
    python -m benchmarks --quick                   # every part once, small: about 10 minutes
    python -m benchmarks --parts drain --drain-args "--backends sqlite --processes 1,2"
    python -m benchmarks --plot benchmarks/results/run-20261122-120000.json   # redraw a run's plots
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shlex
import time
from pathlib import Path
from typing import Any

from benchmarks import backlog, drain, enqueue, plots, relay

PARTS = ("enqueue", "drain", "backlog", "relay")
RUNNERS = {"enqueue": enqueue.run, "drain": drain.run, "backlog": backlog.run, "relay": relay.run}
#: ``--quick``: each part small enough to show it works and roughly where it stands, not to quote.
QUICK = {
    "enqueue": "--batch-jobs 5000 --one-jobs 500 --repeats 1",
    "drain": "--processes 1,2 --repeats 1 --configs 1000x500 --jobs 10000 --latency-rates 500 --latency-seconds 3",
    "backlog": "--backlogs 10000,100000 --repeats 50",
    "relay": "--events 20000 --relays 1 --repeats 1",
}
PLOTS = Path(__file__).parent.parent / "docs" / "benchmarks"


def machine() -> dict[str, Any]:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(memory, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average_at_start": os.getloadavg(),
    }


def goals(run: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for part in PARTS:
        found = run.get(part, {})
        for key in ("goals", "goal"):
            lines.extend(f"{part}: {line}" for line in found.get(key, []))
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS), help=f"of {', '.join(PARTS)}")
    parser.add_argument("--quick", action="store_true", help="every part once and small (a smoke run)")
    for part in PARTS:
        parser.add_argument(f"--{part}-args", default=None, help=f"arguments for benchmarks.{part} (see its --help)")
    parser.add_argument("--plots", type=Path, default=PLOTS, help="where the PNG plots go")
    parser.add_argument("--plot", type=Path, default=None, help="only redraw the plots of this run's JSON")
    options = parser.parse_args(argv)
    if options.plot is not None:
        for path in plots.draw(json.loads(options.plot.read_text()), options.plots):
            print(f"drew {path}")
        return
    parts = options.parts.split(",")
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"--parts: unknown {sorted(unknown)}; known: {', '.join(PARTS)}")
    began = time.time()
    run: dict[str, Any] = {"benchmark": "run", "machine": machine(), "parts": {}}
    for part in parts:
        text = getattr(options, f"{part}_args")
        if text is None and options.quick:
            text = QUICK[part]
        arguments = shlex.split(text or "")
        run["parts"][part] = arguments
        print(f"\n== {part}: python -m benchmarks.{part} {' '.join(arguments)}", flush=True)
        run[part] = RUNNERS[part](arguments)
    run["seconds"] = time.time() - began
    run["machine"]["load_average_at_end"] = os.getloadavg()
    run["goals"] = goals(run)
    drain.RESULTS.mkdir(exist_ok=True)
    out = drain.RESULTS / f"run-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(run, indent=2, default=str))
    print("\n== goals, as ratios from this run")
    for line in run["goals"]:
        print(f"  {line}")
    if importlib.util.find_spec("matplotlib") is None:
        print("matplotlib is not installed, so no plots were drawn: scripts/bench installs it (the bench extra)")
    else:
        for path in plots.draw(run, options.plots):
            print(f"drew {path}")
    print(f"\nwritten to {out} after {run['seconds'] / 60:.1f} minutes")
    print("to publish it: quote it in docs/benchmarks.md and list its files in docs/benchmarks/history.md")


if __name__ == "__main__":
    main()
