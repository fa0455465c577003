"""PNG plots of a benchmark run, for docs/benchmarks.md: throughput against worker processes, pickup latency
at each offered rate, claim cost against backlog, and the outbox relay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: One colour per kind on every plot; the raw floor is drawn dashed.
COLOURS = {
    "raw": "#7f7f7f",
    "dibs": "#1f77b4",
    "pgqueuer": "#ff7f0e",
    "procrastinate": "#2ca02c",
    "huey": "#d62728",
    "raw-tuned": "#bcbd22",
}
BACKEND_NAMES = {"postgresql": "PostgreSQL", "sqlite": "SQLite", "mariadb": "MariaDB"}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, no screen
    import matplotlib.pyplot as plt

    return plt


def throughput(drain: dict[str, Any], out: Path) -> Path:
    """Best median jobs/s of each kind against the number of worker processes, one panel per backend."""
    plt = _pyplot()
    backends = list(dict.fromkeys(row["backend"] for row in drain["summary"]))
    figure, axes = plt.subplots(1, len(backends), figsize=(5 * len(backends), 4), squeeze=False)
    for axis, backend in zip(axes[0], backends, strict=True):
        rows = [row for row in drain["summary"] if row["backend"] == backend]
        kinds = [kind for kind in COLOURS if any(kind in row for row in rows)]
        for kind in kinds:
            points = [(row["processes"], row[kind]["jobs_per_second"]) for row in rows if kind in row]
            axis.plot(
                [p for p, _ in points],
                [rate for _, rate in points],
                marker="o",
                color=COLOURS[kind],
                linestyle="--" if kind == "raw" else "-",
                label="raw-SQL floor" if kind == "raw" else kind,
            )
        axis.set_title(BACKEND_NAMES.get(backend, backend))
        axis.set_xlabel("worker processes")
        axis.set_xscale("log", base=2)
        axis.set_xticks(sorted({row["processes"] for row in rows}))
        axis.set_xticklabels([str(p) for p in sorted({row["processes"] for row in rows})])
        axis.set_ylabel("jobs/s (median, best setting)")
        axis.set_ylim(bottom=0)
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize="small")
    figure.suptitle("Drain throughput of no-op jobs")
    figure.tight_layout()
    path = out / "throughput.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def latency(drain: dict[str, Any], out: Path) -> Path | None:
    """Enqueue-to-start p50, p95 and p99 at each offered rate."""
    measured = drain.get("latency") or []
    if not measured:
        return None
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(6, 4))
    width = 0.25
    for offset, (key, name) in enumerate((("p50_ms", "p50"), ("p95_ms", "p95"), ("p99_ms", "p99"))):
        axis.bar(
            [n + (offset - 1) * width for n in range(len(measured))],
            [result[key] for result in measured],
            width,
            label=name,
        )
    axis.set_xticks(range(len(measured)))
    axis.set_xticklabels(
        [
            f"{r.get('kind', 'dibs')}\n{r['offered_rate']:,.0f} offered\n{r['achieved_rate']:,.0f} achieved"
            for r in measured
        ],
        fontsize="small",
    )
    axis.set_yscale("log")
    axis.set_ylabel("enqueue to start, ms")
    axis.set_xlabel("jobs/s")
    axis.grid(True, axis="y", alpha=0.3)
    axis.legend()
    axis.set_title("Pickup latency, PostgreSQL, one worker woken by LISTEN/NOTIFY")
    figure.tight_layout()
    path = out / "latency.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def backlog(results: dict[str, Any], out: Path) -> Path | None:
    """Claim cost against the number of queued rows, one line per backend, batch size and kind."""
    rows = results.get("rows") or []
    grown = [row for row in rows if not row.get("finished")]
    if not grown:
        return None
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(8, 4.5))
    colours = {"postgresql": "#1f77b4", "sqlite": "#2ca02c", "mariadb": "#ff7f0e"}
    for backend, batch, kind in dict.fromkeys((row["backend"], row["batch"], row["kind"]) for row in grown):
        points = sorted(
            (row["backlog"], row["claim_ms_median"])
            for row in grown
            if (row["backend"], row["batch"], row["kind"]) == (backend, batch, kind)
        )
        axis.plot(
            [backlog for backlog, _ in points],
            [ms for _, ms in points],
            marker="o" if batch <= 100 else "s",
            color=colours.get(backend),
            linestyle="--" if kind == "raw" else "-",
            label=f"{BACKEND_NAMES.get(backend, backend)}, batch {batch}{', raw floor' if kind == 'raw' else ''}",
        )
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("queued jobs")
    axis.set_ylabel("one claim, ms (median)")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize="x-small", loc="center left", bbox_to_anchor=(1.02, 0.5))
    axis.set_title("Claim cost as the backlog grows (solid: dibs, dashed: raw floor)")
    figure.tight_layout()
    path = out / "backlog.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def relay(results: dict[str, Any], out: Path) -> Path | None:
    """The relay's median events/s per kind and number of relays."""
    rows = results.get("table") or []
    if not rows:
        return None
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(6, 4))
    counts = sorted({row["relays"] for row in rows})
    kinds = list(dict.fromkeys(row["kind"] for row in rows))
    width = 0.8 / len(kinds)
    for offset, kind in enumerate(kinds):
        rates = [
            max((row["events_per_second"] for row in rows if (row["relays"], row["kind"]) == (n, kind)), default=0.0)
            for n in counts
        ]
        axis.bar(
            [n + (offset - (len(kinds) - 1) / 2) * width for n in range(len(counts))],
            rates,
            width,
            label=kind,
            color=COLOURS.get(kind),
        )
    axis.set_xticks(range(len(counts)))
    axis.set_xticklabels([f"{n} relay{'s' if n > 1 else ''}" for n in counts])
    axis.set_ylabel("events/s (median)")
    axis.grid(True, axis="y", alpha=0.3)
    axis.legend()
    axis.set_title("Outbox relay, PostgreSQL to Redis Streams, ordered per aggregate")
    figure.tight_layout()
    path = out / "relay.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def draw(run: dict[str, Any], out: Path) -> list[Path]:
    """Every plot the run has data for, written into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    drawn: list[Path | None] = []
    if "drain" in run:
        drawn += [throughput(run["drain"], out), latency(run["drain"], out)]
    if "backlog" in run:
        drawn.append(backlog(run["backlog"], out))
    if "relay" in run:
        drawn.append(relay(run["relay"], out))
    return [path for path in drawn if path is not None]
