"""Enqueue-to-start latency on PostgreSQL: a producer process enqueues one job at a time at a fixed rate
to a running (not burst) worker that wakes on LISTEN/NOTIFY."""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import time
from typing import Any

import sqlalchemy as sa

import dibs
from benchmarks.drain_kinds import drain_app

# -- enqueue-to-start latency ----------------------------------------------------------------------

#: The worker the latency runs use: enough runners and a batch large enough to keep up with the highest
#: offered rate (the defaults, concurrency 10 and batch 20, drain about 5,000 jobs/s here).
LATENCY_WORKER = {"concurrency": 100, "batch": 200, "poll": 2.0}


def latency_worker(url: str, total: int, setting: dict[str, Any], start: Any) -> list[tuple[float, float]]:
    """Run a worker until ``total`` jobs have started; returns (sent, started) wall-clock times."""
    app = dibs.App(url)
    seen: list[tuple[float, float]] = []
    worker: dibs.Worker | None = None

    @app.task(name="stamp")
    async def stamp(sent: float) -> None:
        seen.append((sent, time.time()))
        if len(seen) == total and worker is not None:
            # Stop once the last successes are written, which is not what this measures.
            asyncio.get_running_loop().call_later(0.5, worker.stop)

    worker = app.worker(
        concurrency=setting["concurrency"],
        batch=setting["batch"],
        poll=setting["poll"],
        handle_signals=False,
        tune_gc=True,
    )
    with app.engine.connect():
        pass
    start.wait()
    worker.run()
    app.engine.dispose()
    return seen


#: One producer process offers at most this many jobs a second; more take a share of the schedule each.
PRODUCER_RATE = 1_000
#: A producer that fell behind catches up in transactions of at most this many jobs.
PRODUCER_CHUNK = 100


def latency_producer(url: str, rate: float, total: int, share: int, shares: int, start: Any) -> dict[str, float]:
    """Offer jobs ``share``, ``share + shares``, ... of ``total`` on a fixed schedule of ``rate`` a second
    (job n is due at n / rate seconds), never sending one before its time.

    Each pass enqueues the jobs whose time has come in one transaction: one ``app.enqueue()`` when one
    is due (at low rates, nearly always), ``app.enqueue_many()`` of up to ``PRODUCER_CHUNK`` when the
    producer's own round trip let several fall due. Each job carries ``time.time()`` taken just before
    its enqueue call."""
    app = dibs.App(url)

    @app.task(name="stamp")
    async def stamp(sent: float) -> None:
        return None

    with app.engine.connect():
        pass
    mine = range(share, total, shares)
    sent = transactions = 0
    start.wait()
    time.sleep(1.0)  # the worker is listening before the first job
    began = time.perf_counter()
    while sent < len(mine):
        wait = mine[sent] / rate - (time.perf_counter() - began)
        if wait > 0:
            time.sleep(wait)
            continue
        due = 1
        while (
            sent + due < len(mine) and due < PRODUCER_CHUNK and mine[sent + due] / rate <= time.perf_counter() - began
        ):
            due += 1
        now = time.time()
        if due == 1:
            app.enqueue("stamp", {"sent": now})
        else:
            app.enqueue_many("stamp", [{"sent": now}] * due)
        sent += due
        transactions += 1
    elapsed = time.perf_counter() - began
    app.engine.dispose()
    return {"jobs": sent, "seconds": elapsed, "transactions": transactions}


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def latency(manager: Any, url: str, rate: float, seconds: float, setting: dict[str, Any]) -> dict[str, Any]:
    """Enqueue-to-start latency of one worker (not burst) fed at ``rate`` jobs a second."""
    app = drain_app(url)
    dibs.schema.metadata.drop_all(app.engine)
    app.init()
    app.engine.dispose()
    total = round(rate * seconds)
    shares = math.ceil(rate / PRODUCER_RATE)
    context = multiprocessing.get_context("spawn")
    start = manager.Barrier(shares + 2)
    with context.Pool(shares + 1) as pool:
        worker = pool.apply_async(latency_worker, (url, total, setting, start))
        senders = [
            pool.apply_async(latency_producer, (url, rate, total, share, shares, start)) for share in range(shares)
        ]
        start.wait(timeout=120)
        sent = [sender.get(timeout=seconds * 5 + 120) for sender in senders]
        seen = worker.get(timeout=120)
    if len(seen) != total:
        raise RuntimeError(f"latency: the worker started {len(seen)} of {total} jobs")
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT status, count(*), extract(epoch FROM percentile_cont(0.5) WITHIN GROUP (ORDER BY started_at - "
            "enqueued_at)), extract(epoch FROM percentile_cont(0.99) WITHIN GROUP (ORDER BY started_at - enqueued_at)) "
            "FROM dibs_jobs GROUP BY status"
        ).all()
    engine.dispose()
    unfinished = {row[0]: row[1] for row in rows if row[0] != "succeeded"}
    if unfinished or sum(row[1] for row in rows) != total:
        raise RuntimeError(f"latency: expected {total} jobs succeeded, found {[(r[0], r[1]) for r in rows]}")
    waits = [started - sent_at for sent_at, started in seen]
    return {
        "offered_rate": rate,
        "jobs": total,
        "producers": shares,
        "achieved_rate": total / max(part["seconds"] for part in sent),
        "jobs_per_transaction": total / sum(part["transactions"] for part in sent),
        "worker": setting,
        "p50_ms": percentile(waits, 0.50) * 1000,
        "p95_ms": percentile(waits, 0.95) * 1000,
        "p99_ms": percentile(waits, 0.99) * 1000,
        "max_ms": max(waits) * 1000,
        # started_at - enqueued_at, both statement times on the database clock.
        "db_p50_ms": float(rows[0][2]) * 1000,
        "db_p99_ms": float(rows[0][3]) * 1000,
    }


def describe_latency(result: dict[str, Any]) -> str:
    per = f", {result['jobs_per_transaction']:.1f} per transaction" if "jobs_per_transaction" in result else ""
    return (
        f"{result.get('kind', 'dibs')}: {result['offered_rate']:,.0f} jobs/s offered, "
        f"{result['achieved_rate']:,.0f} achieved ({result['jobs']:,} jobs{per}): p50 {result['p50_ms']:.1f} ms, "
        f"p95 {result['p95_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms, max {result['max_ms']:.1f} ms"
    )
