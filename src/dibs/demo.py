"""The demo: a realistic mixed workload drained by worker processes on the embedded SQLite default.

Run with ``dibs demo`` (or ``python -m dibs.demo``). It enqueues thumbnails, e-mails that sometimes
fail and are retried, card charges that must run one at a time per customer, reports scheduled a few
seconds ahead, and feed imports that always fail and end as dead letters. Worker processes drain it
with a live progress bar; one worker is killed (SIGKILL) mid-batch, and the others run its jobs once
its leases expire. The summary checks, from the database and the workers' own logs, that every job
reached a final state, no job ran twice while its lease was valid, each customer's charges ran in
order, and no scheduled job started early.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import multiprocessing
import os
import random
import signal
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import dibs
from dibs.queue.job import JobContext

LEASE_SECONDS = 3.0
CUSTOMERS = 12


class TransientError(ConnectionError):
    """What a flaky mail server raises."""


def make_app(url: str, log_dir: Path | None = None, worker: int = 0) -> dibs.App:
    """The demo's app: five tasks. Each run is logged (start and end) to the worker's own file."""
    app = dibs.App(url)
    log = (log_dir / f"worker-{worker}.jsonl").open("a", buffering=1) if log_dir else None

    def record(context: JobContext, event: str, **extra: Any) -> None:
        if log is not None:
            entry = {"job": context.job_id, "task": context.task, "attempt": context.attempt, "event": event}
            log.write(json.dumps({**entry, "worker": worker, "t": time.time(), **extra}) + "\n")

    @app.task(name="thumbnail", queue="media")
    def thumbnail(image: str, context: JobContext) -> None:
        record(context, "start")
        time.sleep(random.uniform(0.002, 0.01))
        record(context, "end")

    @app.task(name="send_email", queue="mail", max_attempts=4, retry=dibs.Retry(base=0.3, on=(ConnectionError,)))
    async def send_email(to: str, fails: int, context: JobContext) -> None:
        record(context, "start")
        await asyncio.sleep(random.uniform(0.002, 0.02))
        if context.attempt <= fails:
            record(context, "end", failed=True)
            raise TransientError(f"mail server for {to} timed out")
        record(context, "end")

    @app.task(name="charge", queue="billing", ordering_key="customer")
    def charge(customer: str, seq: int, cents: int, context: JobContext) -> None:
        record(context, "start", key=customer, seq=seq)
        time.sleep(random.uniform(0.005, 0.02))
        record(context, "end", key=customer, seq=seq)

    @app.task(name="daily_report", queue="reports")
    async def daily_report(day: int, context: JobContext) -> None:
        record(context, "start")
        await asyncio.sleep(0.01)
        record(context, "end")

    @app.task(name="import_feed", queue="media", max_attempts=3, retry=dibs.Retry(base=0.2))
    def import_feed(url: str, context: JobContext) -> None:
        record(context, "start")
        record(context, "end", failed=True)
        raise ValueError(f"{url} is not a valid RSS document")

    return app


def enqueue_workload(app: dibs.App, jobs: int) -> dict[str, int]:
    """About ``jobs`` jobs of the five kinds, in one transaction per kind; returns how many of each."""
    rng = random.Random(7)
    thumbnails = int(jobs * 0.55)
    emails = int(jobs * 0.25)
    charges = int(jobs * 0.15)
    reports = max(5, jobs // 50)
    feeds = max(3, jobs // 100)
    app.enqueue_many("thumbnail", [{"image": f"photo-{n}.jpg"} for n in range(thumbnails)])
    app.enqueue_many(
        "send_email",
        [{"to": f"user{n}@example.com", "fails": 1 if rng.random() < 0.2 else 0} for n in range(emails)],
    )
    sequence: Counter[str] = Counter()
    for _ in range(charges):
        customer = f"customer-{rng.randrange(CUSTOMERS)}"
        sequence[customer] += 1
        app.enqueue("charge", {"customer": customer, "seq": sequence[customer], "cents": rng.randrange(100, 9999)})
    for day in range(reports):
        app.enqueue("daily_report", {"day": day}, delay=timedelta(seconds=2 + 2 * day / reports))
    app.enqueue_many("import_feed", [{"url": f"https://feeds.example.com/{n}.xml"} for n in range(feeds)])
    return {
        "thumbnail": thumbnails,
        "send_email": emails,
        "charge": charges,
        "daily_report": reports,
        "import_feed": feeds,
    }


def work(url: str, log_dir: str, worker: int) -> None:
    """One worker process: run until the workload is drained."""
    app = make_app(url, Path(log_dir), worker)
    # The worker's own log (retries, dead letters, recoveries) goes to a file, under the progress bar.
    handler = logging.FileHandler(Path(log_dir) / f"worker-{worker}.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logging.getLogger("dibs").addHandler(handler)
    logging.getLogger("dibs").setLevel(logging.INFO)
    logging.getLogger("dibs").propagate = False
    app.worker(concurrency=8, batch=16, lease=LEASE_SECONDS, poll=0.2, upkeep_every=0.25, burst=True).run()


def run_demo(db: str | None, jobs: int, workers: int, kill: bool, out: Callable[[str], None] | None = None) -> bool:
    """Run the demo; True when every check held."""
    from rich.console import Console

    console = Console(highlight=False)
    path = Path(db or "dibs-demo.sqlite").resolve()
    url, log_dir = _fresh_database(path)
    app = make_app(url)
    app.init()
    counts = enqueue_workload(app, jobs)
    total = sum(counts.values())
    console.print(f"[bold]dibs demo[/]: {total:,} jobs in {path.name} (SQLite), {workers} worker processes")
    console.print(
        f"  {counts['thumbnail']} thumbnails, {counts['send_email']} e-mails (some fail once and are retried), "
        f"{counts['charge']} card charges in order per customer, {counts['daily_report']} reports scheduled "
        f"2-4 s ahead, {counts['import_feed']} feed imports that always fail"
    )
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=work, args=(url, str(log_dir), n)) for n in range(workers)]
    for process in processes:
        process.start()
    started = time.monotonic()
    killed = _drain_with_progress(console, app, processes, total, kill)
    elapsed = time.monotonic() - started
    for process in processes:
        process.join()
    ok = _report(console, _check(app, log_dir, killed))
    console.print(f"Drained {total:,} jobs in {elapsed:.1f} s with {workers} workers.")
    console.print(
        "[bold green]Every job reached a final state; none was lost and none ran twice at once.[/]"
        if ok
        else "[bold red]A check failed: see above.[/]"
    )
    console.print(f"Look around: DIBS_DATABASE_URL={url} dibs status   (logs of every run: {log_dir})")
    return ok


def _fresh_database(path: Path) -> tuple[str, Path]:
    """The demo's SQLite URL and log directory, with what an earlier run left removed."""
    for stale in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        stale.unlink(missing_ok=True)
    log_dir = path.with_name(path.stem + "-logs")
    log_dir.mkdir(exist_ok=True)
    for old in [*log_dir.glob("*.jsonl"), *log_dir.glob("*.log")]:
        old.unlink()
    return f"sqlite:///{path}", log_dir


def _drain_with_progress(console: Any, app: dibs.App, processes: list[Any], total: int, kill: bool) -> int | None:
    """Show progress until every worker process ends, killing one mid-run if asked; returns its number."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    killed: int | None = None
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task("draining", total=total)
        while any(process.is_alive() for process in processes):
            state = _states(app)
            finished = state["succeeded"] + state["dead"] + state["cancelled"]
            progress.update(
                bar,
                completed=finished,
                description=f"running {state['running']:>3}  queued {state['queued']:>5}  "
                f"waiting {state['scheduled']:>3}  dead {state['dead']:>3}",
            )
            last = processes[-1]
            if kill and killed is None and len(processes) > 1 and finished > total * 0.3 and last.is_alive():
                os.kill(last.pid, signal.SIGKILL)
                killed = len(processes) - 1
                progress.console.print(
                    f"[red]killed worker {killed} (SIGKILL) mid-batch[/]: its jobs come back when their "
                    f"{LEASE_SECONDS:g} s leases expire"
                )
            time.sleep(0.2)
        state = _states(app)
        progress.update(bar, completed=state["succeeded"] + state["dead"] + state["cancelled"])
    return killed


def _report(console: Any, checks: dict[str, Any]) -> bool:
    """Print the table per kind of job and the checks' findings; True when every check held."""
    from rich.table import Table

    table = Table(title="What happened to each kind of job")
    for column in ("task", "jobs", "succeeded", "after a retry", "dead letters", "runs"):
        table.add_column(column, justify="left" if column == "task" else "right")
    for task, row in sorted(checks["per_task"].items()):
        table.add_row(task, *(f"{row[key]:,}" for key in ("jobs", "succeeded", "retried", "dead", "runs")))
    console.print(table)
    for line in checks["lines"]:
        console.print(line)
    return bool(checks["ok"])


def _states(app: dibs.App) -> Counter[str]:
    state: Counter[str] = Counter()
    for status in app.status():
        state.update(status.counts)
    return state


def _check(app: dibs.App, log_dir: Path, killed: int | None) -> dict[str, Any]:
    """Check the outcome from the jobs table and the workers' logs."""
    jobs = {job.id: job for job in app.jobs(limit=1_000_000)}
    runs, cut_short_runs = _runs(log_dir)
    cut_short = Counter(worker for _, _, worker in cut_short_runs)
    lines: list[str] = []
    unfinished = [job.id for job in jobs.values() if job.status not in ("succeeded", "dead", "cancelled")]
    if unfinished:
        lines.append(f"[red]{len(unfinished)} jobs did not reach a final state: {unfinished[:10]}[/]")
    overlaps = 0
    for job_runs in runs.values():
        ordered = sorted(job_runs, key=lambda run: run["t"])
        overlaps += sum(1 for a, b in itertools.pairwise(ordered) if b["t"] < a["end"])
    lines.append(f"Runs of one job that overlapped in time: {overlaps}.")
    early = [job.id for job in jobs.values() if job.started_at is not None and job.started_at < job.run_at]
    reports = [job for job in jobs.values() if job.task == "daily_report"]
    lines.append(
        f"Scheduled reports: {len(reports)}, started before their time: {len(early)} (checked on the database clock)."
    )
    out_of_order, customers = _charges_out_of_order(runs)
    lines.append(f"Customers whose charges ran out of order or two at once: {out_of_order} of {customers}.")
    if killed is not None:
        lines.append(
            f"Worker {killed} was killed in the middle of {cut_short.get(killed, 0)} jobs; "
            "each of them ran again on another worker after its lease expired."
        )
    dead = [job for job in jobs.values() if job.status == "dead"]
    if dead:
        first = (dead[0].last_error or "").splitlines()[0]
        lines.append(f"Dead letters keep their last error and traceback, e.g. job {dead[0].id}: {first}")
    ok = not unfinished and not overlaps and not early and not out_of_order
    return {"ok": ok, "lines": lines, "per_task": _per_task(jobs, runs, cut_short_runs)}


def _runs(log_dir: Path) -> tuple[dict[int, list[dict[str, Any]]], dict[tuple[int, int, int], dict[str, Any]]]:
    """From the workers' logs: the finished runs of each job, and the starts of runs never finished (by job,
    attempt and worker)."""
    runs: dict[int, list[dict[str, Any]]] = defaultdict(list)
    starts: dict[tuple[int, int, int], dict[str, Any]] = {}
    for log in log_dir.glob("*.jsonl"):
        for line in log.read_text().splitlines():
            entry = json.loads(line)
            run_key = (entry["job"], entry["attempt"], entry["worker"])
            if entry["event"] == "start":
                starts[run_key] = entry
            else:
                runs[entry["job"]].append({**starts.pop(run_key), "end": entry["t"], "failed": entry.get("failed")})
    return runs, starts


def _per_task(
    jobs: dict[int, Any], runs: dict[int, list[dict[str, Any]]], cut_short: dict[tuple[int, int, int], Any]
) -> dict[str, Counter[str]]:
    """Per task: jobs, runs (finished or cut short), succeeded, succeeded after a retry, dead."""
    per_task: dict[str, Counter[str]] = defaultdict(Counter)
    for job in jobs.values():
        row = per_task[job.task]
        row["jobs"] += 1
        row["runs"] += len(runs.get(job.id, ())) + sum(1 for key in cut_short if key[0] == job.id)
        row["succeeded"] += job.status == "succeeded"
        row["dead"] += job.status == "dead"
        row["retried"] += job.status == "succeeded" and job.attempts > 1
    return per_task


def _charges_out_of_order(runs: dict[int, list[dict[str, Any]]]) -> tuple[int, int]:
    """How many customers' charges ran out of order or two at once, and how many customers there were."""
    charges: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for job_runs in runs.values():
        for run in job_runs:
            if run["task"] == "charge":
                charges[run["key"]].append(run)
    out_of_order = 0
    for key_runs in charges.values():
        key_runs.sort(key=lambda run: run["t"])
        seqs = [run["seq"] for run in key_runs]
        out_of_order += seqs != sorted(seqs)
        out_of_order += sum(1 for a, b in itertools.pairwise(key_runs) if b["t"] < a["end"])
    return out_of_order, len(charges)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=2000, help="about how many jobs to enqueue")
    parser.add_argument("--workers", type=int, default=3, help="worker processes")
    parser.add_argument("--db", default=None, help="SQLite file to use (default: dibs-demo.sqlite, recreated)")
    parser.add_argument("--no-kill", action="store_true", help="do not kill a worker mid-run")
    options = parser.parse_args(argv)
    return 0 if run_demo(options.db, options.jobs, options.workers, not options.no_kill) else 1


if __name__ == "__main__":
    sys.exit(main())
