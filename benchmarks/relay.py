"""Outbox relay throughput: events/s from PostgreSQL to Redis Streams, ordering on, beside the raw-SQL floor.

A trial publishes a backlog of N events written up front across A aggregates (event i belongs to
aggregate i % A, so the aggregates interleave), each with a JSON payload of about 160 bytes. R relay
OS processes (imports done, database connections open, Redis pinged) start together when the parent
sets a start event; **events/s = events published / the time from the start until the last of them
was marked published** (the start read on the database clock just before it is given, the end the
largest ``published_at``), so process start-up and shut-down do not count. A trial that has not
published the whole backlog after ``--trial-seconds`` is stopped (gracefully: batches in flight
finish) and measured on what it published: the rate of a slow relay is then taken on the first part
of the backlog instead of taking many minutes.

After every trial the table and the stream are checked, and the run stops otherwise: every event
marked published is in the stream, every entry of the stream is an event of the table with its own
aggregate, each aggregate's events are in the stream in strictly increasing id order, and each
aggregate's published events are its oldest (no later event went out before an earlier one was
published). Second copies of an event are counted and reported as duplicates. Streams are deleted.

* ``dibs``: ``Outbox(url).relay("redis://...?stream=<unique>", burst=True, batch=B, concurrency=C)``,
  everything else at its default (lease 30 s, poll 1 s, LISTEN/NOTIFY on, ``block`` policy). The claim,
  publish and mark-published steps are timed by wrapping them on the relay's instances (a clock pair per
  batch, nothing per event).
* ``raw``: the floor, the same work on psycopg 3 and redis-py's blocking client (which packs commands with
  hiredis, as dibs's publisher does) with no dibs code, one batch at a time per
  process: one claim statement (a MATERIALIZED CTE of pending events with no older unfinished event of
  their aggregate and none of it being published, ORDER BY id LIMIT B FOR UPDATE SKIP LOCKED; then
  UPDATE ... SET status = 'processing' ... RETURNING), one pipelined XADD per batch with the fields dibs
  writes, one UPDATE ... WHERE id = ANY(...) marking them published. The head check is written as dibs
  writes it: two NOT EXISTS. dibs / raw is what dibs costs beyond its SQL.
* ``raw-tuned``: the same floor with two changes to the claim that PostgreSQL plans well whatever its
  statistics say: the aggregates in flight as NOT IN (one hashed subplan, not a loop over every event
  in flight for every candidate), and the target as ``= ANY(array)`` ordered by (target, id), the columns
  of the partial index of pending events (not a walk of the primary key through the events already
  published). dibs / raw-tuned is how far dibs is from the best hand-written relay found.

The events are added once through ``Outbox.add_many`` into a template table and copied into an emptied
``dibs_outbox`` before every trial (then VACUUM ANALYZE and CHECKPOINT). Trials alternate between kinds
within each round; medians are reported, with the ratio of dibs to each floor at the same batch size
and number of processes. CPU time during each trial is read for the relay processes, Redis, the
server's processes for this database (and its background processes) and the whole machine. The run
works in a database of its own (``dibs_bench_relay_<pid>``), created and dropped.

    python -m benchmarks.relay                                   # the default run, about five minutes
    python -m benchmarks.relay --kinds raw-tuned,dibs --configs 1x200,1x500,1x1000,2x200,2x500 --repeats 1
    python -m benchmarks.relay --relays 2 --configs 1x500 --kinds dibs --repeats 1 --profile /tmp/prof
    python -m benchmarks.relay --explain-only                    # EXPLAIN ANALYZE of the claims, no trials
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import multiprocessing
import os
import platform
import queue
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import dibs
from benchmarks import record
from benchmarks.connect import psycopg_connect

POSTGRES_URL = os.environ.get("DIBS_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("DIBS_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
#: The run's own database, named by the process so that two runs on one server never share one (read in
#: the parent only: a spawned relay process has another pid, and is given the URL).
DATABASE = f"dibs_bench_relay_{os.getpid()}"
#: The N events, added once through dibs and copied into dibs_outbox before every trial.
TEMPLATE = "dibs_bench_relay_template"
#: Every stream this benchmark writes starts with this; each is deleted after its trial.
STREAM_PREFIX = "dibs-bench-relay"
ADD_CHUNK = 5_000
TARGET = "default"
KINDS = ("raw", "raw-tuned", "dibs")
#: The issue's goal: events/s with two relay processes on this machine.
GOAL = 20_000.0
GOAL_RELAYS = 2
RESULTS = Path(__file__).parent / "results"

#: What a relay process keeps open after it returns (its database sessions), until the parent has read
#: the server's CPU time.
_KEPT: list[Any] = []

EVENT_TYPES = ("order.placed", "order.paid", "order.packed", "order.shipped", "order.delivered")


def event_fields(i: int, aggregates: int) -> dict[str, Any]:
    """Event i, of aggregate i % A, as add_many() takes it; the payload is about 160 bytes of JSON."""
    order = i % aggregates
    step = i // aggregates
    return {
        "aggregate_type": "order",
        "aggregate_id": str(order),
        "event_type": EVENT_TYPES[step % len(EVENT_TYPES)],
        "payload": {
            "order_id": order,
            "version": step + 1,
            "customer_id": 100_000 + (order * 7919) % 50_000,
            "total_cents": 1_000 + (i * 31) % 90_000,
            "currency": "EUR",
            "items": [{"sku": f"SKU-{(i * 13) % 10_000:05d}", "qty": 1 + i % 3, "price_cents": 995}],
            "channel": "web",
        },
    }


def bench_url() -> str:
    return sa.make_url(POSTGRES_URL).set(database=DATABASE).render_as_string(hide_password=False)


def own_database(create: bool) -> None:
    """Create (or drop) the run's database."""
    admin = sa.create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        if create:
            conn.exec_driver_sql(f"CREATE DATABASE {DATABASE}")
    admin.dispose()


# -- the events: added once through dibs, copied before every trial -----------------------------------


def prepare(url: str, events: int, aggregates: int) -> dict[str, Any]:
    """A fresh dibs schema (dibs.migrate) and a template of the events added through dibs; returns what
    adding them cost and how big their payloads are."""
    outbox = dibs.Outbox(url)
    applied = outbox.init()
    engine = outbox.engine
    began = time.perf_counter()
    for first in range(0, events, ADD_CHUNK):
        chunk = [event_fields(i, aggregates) for i in range(first, min(events, first + ADD_CHUNK))]
        with engine.begin() as conn:
            outbox.add_many(conn, chunk)
    added = events / (time.perf_counter() - began)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {TEMPLATE}")
        conn.exec_driver_sql(f"CREATE TABLE {TEMPLATE} AS SELECT * FROM dibs_outbox ORDER BY id")
        payload = conn.exec_driver_sql(f"SELECT avg(octet_length(payload)) FROM {TEMPLATE}").scalar_one()
    engine.dispose()
    return {"migrations": applied, "add_many_events_per_second": added, "payload_bytes_mean": float(payload)}


def refill(url: str) -> None:
    """dibs_outbox holds exactly the template's events, all pending; fresh indexes and statistics."""
    with psycopg_connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE TABLE dibs_outbox")
        conn.execute(f"INSERT INTO dibs_outbox SELECT * FROM {TEMPLATE} ORDER BY id")
        conn.execute("VACUUM ANALYZE dibs_outbox")
        conn.execute("CHECKPOINT")


# -- dibs ------------------------------------------------------------------------------------------------


class Timings:
    """Calls, rows and seconds of one step of a relay; appended from the relay's threads (list.append is
    atomic), summed at the end."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, int]] = []

    def summary(self) -> dict[str, float]:
        count = len(self.calls)
        seconds = sum(s for s, _ in self.calls)
        rows = sum(n for _, n in self.calls)
        return {
            "calls": count,
            "empty": sum(1 for _, n in self.calls if n == 0),
            "rows": rows,
            "seconds": seconds,
            "mean_ms": seconds / count * 1000 if count else 0.0,
            "mean_rows": rows / count if count else 0.0,
        }


def instrument(relay: Any) -> dict[str, Timings]:
    """Time the relay's three steps (claim, publish, mark published) by wrapping them on its instances."""
    steps = {"claim": Timings(), "publish": Timings(), "mark": Timings()}
    store, publisher = relay.outbox.store, relay.publisher
    claim, complete, publish = store.claim, store.complete, publisher.publish

    def timed_claim(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        held = claim(*args, **kwargs)
        steps["claim"].calls.append((time.perf_counter() - began, len(held)))
        return held

    def timed_complete(conn: Any, held: Any) -> Any:
        began = time.perf_counter()
        lost = complete(conn, held)
        steps["mark"].calls.append((time.perf_counter() - began, len(held)))
        return lost

    async def timed_publish(events: Any) -> Any:
        began = time.perf_counter()
        outcomes = await publish(events)
        steps["publish"].calls.append((time.perf_counter() - began, len(events)))
        return outcomes

    store.claim, store.complete, publisher.publish = timed_claim, timed_complete, timed_publish
    return steps


def dibs_relay(
    url: str, stream: str, setting: dict[str, Any], name: str, ready: Any, start: Any, stop: Any
) -> dict[str, Any]:
    outbox = dibs.Outbox(url)
    relay = outbox.relay(
        f"{REDIS_URL}?stream={stream}",
        burst=True,
        batch=setting["batch"],
        concurrency=setting["concurrency"],
        handle_signals=False,
        name=name,
    )
    steps = instrument(relay)
    # The pool's connections for the relay's lanes are made before the clock starts, as the floor's is.
    warm = [outbox.engine.connect() for _ in range(setting["concurrency"] + 1)]
    for conn in warm:
        conn.exec_driver_sql("SELECT 1")
    for conn in warm:
        conn.close()

    async def stop_when_told() -> None:
        # Polled: a process that ends while it sleeps on a multiprocessing Event leaves the parent's set()
        # of that Event waiting for it forever.
        while not stop.is_set():
            await asyncio.sleep(0.05)
        relay.stop()

    async def run() -> tuple[Any, float, float]:
        await relay.publisher.connect()  # a Redis connection on this loop before the clock starts
        ready.put((name, os.getpid()))
        await asyncio.get_running_loop().run_in_executor(None, start.wait)
        stopper = asyncio.create_task(stop_when_told())
        cpu = _cpu()
        stats = await relay.arun()
        used = _cpu() - cpu
        stopper.cancel()
        return stats, time.time(), used

    stats, ended, cpu = asyncio.run(run())
    _KEPT.append(outbox)
    return {
        "name": name,
        "events": stats.published,
        "ended": ended,
        "cpu_seconds": cpu,
        "stats": asdict(stats),
        "steps": {step: timings.summary() for step, timings in steps.items()},
    }


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


# -- the raw floor: psycopg 3 and redis-py, no dibs code -------------------------------------------------

_CLAIM = """
WITH picked AS MATERIALIZED (
    SELECT o.id FROM dibs_outbox AS o
    WHERE o.status = 'pending' AND {target}
        AND {head}
    ORDER BY {order}
    LIMIT %(batch)s
    FOR UPDATE OF o SKIP LOCKED)
UPDATE dibs_outbox AS o SET status = 'processing', lease_owner = %(owner)s,
    lease_expires_at = statement_timestamp() + interval '30 seconds', lease_token = o.lease_token + 1,
    attempts = o.attempts + 1
WHERE o.id = ANY(ARRAY(SELECT id FROM picked))
RETURNING o.id, o.aggregate_type, o.aggregate_id, o.event_type, o.payload, o.headers, o.created_at
"""
#: The head of its aggregate, as dibs writes it (since e7228b5): no older unfinished event of the
#: aggregate, and none of it being published, as two NOT EXISTS.
HEAD = """NOT EXISTS (
            SELECT 1 FROM dibs_outbox AS a
            WHERE a.target = o.target AND a.aggregate_type = o.aggregate_type AND a.aggregate_id = o.aggregate_id
                AND a.status IN ('pending', 'failed', 'abandoned') AND a.id < o.id)
        AND NOT EXISTS (
            SELECT 1 FROM dibs_outbox AS p
            WHERE p.target = o.target AND p.aggregate_type = o.aggregate_type AND p.aggregate_id = o.aggregate_id
                AND p.status = 'processing')"""
#: The same rule with the second check as NOT IN: one hashed subplan over the aggregates in flight (the
#: partial index dibs_outbox_in_flight) per statement. As NOT EXISTS, planned on statistics that saw
#: nothing in flight, it becomes a nested loop over every event in flight for every candidate.
HEAD_TUNED = """NOT EXISTS (
            SELECT 1 FROM dibs_outbox AS a
            WHERE a.target = o.target AND a.aggregate_type = o.aggregate_type AND a.aggregate_id = o.aggregate_id
                AND a.status IN ('pending', 'failed', 'abandoned') AND a.id < o.id)
        AND (o.aggregate_type, o.aggregate_id) NOT IN (
            SELECT p.aggregate_type, p.aggregate_id FROM dibs_outbox AS p
            WHERE p.status = 'processing' AND p.target = %(target)s)"""
RAW_CLAIMS = {
    "raw": _CLAIM.format(target="o.target = %(target)s", head=HEAD, order="o.id"),
    # Also the target as an array and the order as the claim index's columns: the order is then not the
    # primary key's, so the pending events are read from the partial index dibs_outbox_claim whatever the
    # statistics say. Planned on stale statistics (a backlog analyzed when all of it was pending), the
    # primary key in id order looks as good, and every claim walks the events already published.
    "raw-tuned": _CLAIM.format(target="o.target = ANY(%(targets)s)", head=HEAD_TUNED, order="o.target, o.id"),
}
RAW_MARK = """
UPDATE dibs_outbox SET status = 'published', published_at = statement_timestamp(), lease_expires_at = NULL
WHERE id = ANY(%(ids)s)
"""
RAW_LEFT = "SELECT EXISTS (SELECT 1 FROM dibs_outbox WHERE status IN ('pending', 'processing') AND target = %s)"


def raw_relay(
    kind: str, url: str, stream: str, setting: dict[str, Any], name: str, ready: Any, start: Any, stop: Any
) -> dict[str, Any]:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    client.ping()
    steps = {"claim": Timings(), "publish": Timings(), "mark": Timings()}
    claim = RAW_CLAIMS[kind]
    done = 0
    conn = psycopg_connect(url, autocommit=True)
    _KEPT.append(conn)
    conn.execute("SELECT 1")
    ready.put((name, os.getpid()))
    start.wait()
    cpu = _cpu()
    parameters = {"target": TARGET, "targets": [TARGET], "batch": setting["batch"], "owner": name}
    while not stop.is_set():
        began = time.perf_counter()
        rows = conn.execute(claim, parameters).fetchall()
        steps["claim"].calls.append((time.perf_counter() - began, len(rows)))
        if not rows:
            # The events left, if any, wait behind another process's batch of their aggregate.
            if not conn.execute(RAW_LEFT, (TARGET,)).fetchone()[0]:
                break
            time.sleep(0.001)
            continue
        began = time.perf_counter()
        pipeline = client.pipeline(transaction=False)
        for event_id, aggregate_type, aggregate_id, event_type, payload, headers, created_at in rows:
            pipeline.xadd(
                stream,
                {
                    "id": event_id,
                    "aggregate_type": aggregate_type,
                    "aggregate_id": aggregate_id,
                    "event_type": event_type,
                    "payload": payload,
                    "headers": headers or "{}",
                    "created_at": created_at.isoformat(),
                },
            )
        pipeline.execute()
        steps["publish"].calls.append((time.perf_counter() - began, len(rows)))
        began = time.perf_counter()
        conn.execute(RAW_MARK, {"ids": [row[0] for row in rows]})
        steps["mark"].calls.append((time.perf_counter() - began, len(rows)))
        done += len(rows)
    ended, cpu = time.time(), _cpu() - cpu
    client.close()
    return {
        "name": name,
        "events": done,
        "ended": ended,
        "cpu_seconds": cpu,
        "stats": {},
        "steps": {step: timings.summary() for step, timings in steps.items()},
    }


# -- one trial -------------------------------------------------------------------------------------------


def _process(
    kind: str,
    url: str,
    stream: str,
    setting: dict[str, Any],
    name: str,
    events: tuple[Any, Any, Any],
    queues: tuple[Any, Any],
) -> None:
    """One relay process: report ready, wait for the start, relay until done or told to stop, report, then
    wait for the parent to take its measurements (its database sessions stay open until then)."""
    start, stop, finish = events
    ready, results = queues
    try:
        if kind == "dibs":
            results.put(dibs_relay(url, stream, setting, name, ready, start, stop))
        else:
            results.put(raw_relay(kind, url, stream, setting, name, ready, start, stop))
    except BaseException:
        results.put({"name": name, "error": traceback.format_exc()})
    deadline = time.monotonic() + 600
    while not finish.is_set() and time.monotonic() < deadline:  # polled, as the stop is (see dibs_relay)
        time.sleep(0.05)


@dataclass
class Trial:
    kind: str
    setting: str
    batch: int
    concurrency: int
    relays: int
    #: N, and how many of them were published (all, unless the trial was stopped at --trial-seconds).
    backlog: int
    events: int
    aggregates: int
    capped: bool
    #: From the start to the last event marked published, on the database clock.
    seconds: float
    #: From the start to the last relay process returning (its shutdown included), on the wall clock.
    exit_seconds: float
    #: Entries in the stream; second copies of an event among them.
    stream_entries: int
    duplicates: int
    #: Events claimed more than once (attempts > 1 in the table).
    reclaimed: int
    #: CPU seconds during the trial: the relay processes, Redis, PostgreSQL (this database's sessions and
    #: the server's background processes), the whole machine (other work on it included).
    cpu: dict[str, float] = field(default_factory=dict)
    processes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds


def label(kind: str, setting: dict[str, Any]) -> str:
    if kind == "dibs":
        return f"c{setting['concurrency']}/b{setting['batch']}"
    return f"b{setting['batch']}"


def trial(
    kind: str,
    url: str,
    setting: dict[str, Any],
    relays: int,
    backlog: int,
    aggregates: int,
    number: int,
    cap: float,
    profile: Path | None,
) -> Trial:
    import redis

    refill(url)
    stream = f"{STREAM_PREFIX}-{os.getpid()}-{number}"
    client = redis.Redis.from_url(REDIS_URL)
    client.delete(stream)
    context = multiprocessing.get_context("spawn")
    ready, results = context.Queue(), context.Queue()
    start, stop, finish = context.Event(), context.Event(), context.Event()
    processes = [
        context.Process(
            target=_process,
            args=(kind, url, stream, setting, f"{kind}-{n}", (start, stop, finish), (ready, results)),
            daemon=True,
        )
        for n in range(relays)
    ]
    spies: list[subprocess.Popen[bytes]] = []
    capped = False
    try:
        for process in processes:
            process.start()
        pids = [ready.get(timeout=120)[1] for _ in processes]
        if profile is not None and kind == "dibs":
            name = f"{kind}-x{relays}-{label(kind, setting).replace('/', '-')}-{number}"
            spies = [spy(pid, profile / f"{name}-{n}.txt") for n, pid in enumerate(pids)]
            time.sleep(1.0)  # py-spy attached before the clock starts
        with psycopg_connect(url, autocommit=True) as conn:
            cpu_before = cpu_counters(client)
            began_db = conn.execute("SELECT clock_timestamp()").fetchone()[0]
            began = time.time()
            start.set()
            reports: list[dict[str, Any]] = []
            while len(reports) < relays:
                try:
                    reports.append(results.get(timeout=max(0.01, began + cap - time.time()) if not capped else 300))
                except queue.Empty:
                    if capped:
                        raise
                    capped = True
                    stop.set()
            cpu_after = cpu_counters(client)
            finish.set()
            errors = [report["error"] for report in reports if "error" in report]
            if errors:
                raise RuntimeError(f"{kind} {label(kind, setting)} x{relays}: a relay failed:\n" + "\n".join(errors))
            span, published = conn.execute(
                "SELECT extract(epoch FROM max(published_at) - %s), count(*) FILTER (WHERE status = 'published') "
                "FROM dibs_outbox",
                (began_db,),
            ).fetchone()
        for process in processes:
            process.join(timeout=60)
        for process_spy in spies:
            process_spy.wait(timeout=60)
    finally:
        # Each is set once only: set() waits for the processes sleeping on the Event to wake up, and a
        # process that died asleep never does (only the start is slept on; stop and finish are polled).
        for event in (start, stop, finish):
            if not event.is_set():
                event.set()
        for process in processes:
            if process.is_alive():
                process.kill()
        for process_spy in spies:
            if process_spy.poll() is None:
                process_spy.kill()
    what = f"{kind} {label(kind, setting)} x{relays}"
    try:
        entries, duplicates, reclaimed = verify(url, client, stream, backlog, aggregates, capped, what)
    finally:
        client.delete(stream)
        client.close()
    if not capped and published != backlog:
        raise RuntimeError(f"{what}: {published} of {backlog} events published")
    reports.sort(key=lambda report: report["name"])
    return Trial(
        kind=kind,
        setting=label(kind, setting),
        batch=setting["batch"],
        concurrency=setting.get("concurrency", 1),
        relays=relays,
        backlog=backlog,
        events=published,
        aggregates=aggregates,
        capped=capped,
        seconds=float(span),
        exit_seconds=max(report["ended"] for report in reports) - began,
        stream_entries=entries,
        duplicates=duplicates,
        reclaimed=reclaimed,
        cpu={
            "relays": sum(report["cpu_seconds"] for report in reports),
            **{name: cpu_after[name] - cpu_before[name] for name in cpu_before},
        },
        processes=reports,
    )


def verify(
    url: str, client: Any, stream: str, backlog: int, aggregates: int, capped: bool, what: str
) -> tuple[int, int, int]:
    """Check the table and the stream (see the module's docstring); raise if anything is wrong. Returns
    (stream entries, duplicates among them, events claimed more than once)."""
    with psycopg_connect(url) as conn:
        states = dict(conn.execute("SELECT status, count(*) FROM dibs_outbox GROUP BY status").fetchall())
        reclaimed = conn.execute("SELECT count(*) FROM dibs_outbox WHERE attempts > 1").fetchone()[0]
        expected = {
            event_id: (aggregate, status)
            for event_id, aggregate, status in conn.execute("SELECT id, aggregate_id, status FROM dibs_outbox")
        }
        # An aggregate whose published events are not its oldest: one went out ahead of an earlier one.
        # Pending events that a claim would take now: left behind by relays that stopped as if done.
        claimable = conn.execute(
            f"SELECT count(*) FROM dibs_outbox AS o WHERE o.status = 'pending' AND {HEAD}"
        ).fetchone()[0]
        overtaken = conn.execute(
            "SELECT count(*) FROM (SELECT max(id) FILTER (WHERE status = 'published') AS last_published, "
            "min(id) FILTER (WHERE status <> 'published') AS first_left FROM dibs_outbox "
            "GROUP BY target, aggregate_type, aggregate_id) AS a WHERE last_published > first_left"
        ).fetchone()[0]
    allowed = {"published"} | ({"pending"} if capped else set())
    if set(states) - allowed or len(expected) != backlog or overtaken:
        raise RuntimeError(
            f"{what}: expected {backlog} events, {'published or pending' if capped else 'all published'}, "
            f"found {states} ({claimable} of them claimable heads of their aggregates); {overtaken} aggregates "
            "with an event published ahead of an earlier one"
        )
    seen: collections.Counter[int] = collections.Counter()
    last: dict[str, int] = {}
    entries = out_of_order = wrong = 0
    examples: list[str] = []
    cursor = "-"
    while True:
        chunk = client.xrange(stream, min=cursor, max="+", count=10_000)
        if not chunk:
            break
        for _, fields in chunk:
            entries += 1
            event_id = int(fields[b"id"])
            aggregate = fields[b"aggregate_id"].decode()
            seen[event_id] += 1
            if seen[event_id] > 1:
                continue
            if event_id not in expected or expected[event_id][0] != aggregate:
                wrong += 1
            if last.get(aggregate, 0) >= event_id:
                out_of_order += 1
                if len(examples) < 5:
                    examples.append(f"aggregate {aggregate}: event {event_id} after {last[aggregate]}")
            last[aggregate] = max(event_id, last.get(aggregate, 0))
        cursor = "(" + chunk[-1][0].decode()
    published = {event_id for event_id, (_, status) in expected.items() if status == "published"}
    missing = len(published - set(seen))
    unmarked = len(set(seen) - published)  # in the stream but not marked published: sent again later
    if missing or out_of_order or wrong or unmarked or (not capped and len(last) != min(aggregates, backlog)):
        raise RuntimeError(
            f"{what}: {missing} published events missing from the stream, {unmarked} in it but not marked "
            f"published, {out_of_order} out of order ({'; '.join(examples)}), {wrong} not an event of the "
            f"table or with the wrong aggregate, {len(last)} aggregates seen"
        )
    return entries, entries - len(seen), reclaimed


def spy(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling a relay process (every thread that is not idle) into collapsed stacks."""
    command = [shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")]
    command += ["record", "--pid", str(pid), "--rate", "200", "--format", "raw", "--nonblocking", "--output", str(out)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# -- CPU accounting --------------------------------------------------------------------------------------


def cpu_counters(client: Any) -> dict[str, float]:
    """CPU seconds so far: Redis (its own counters); the PostgreSQL processes serving this database, and the
    server's background processes (WAL writer, checkpointer, ...), but not other databases' sessions; the
    whole machine."""
    info = client.info("cpu")
    ticks = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    busy = sum(fields) - fields[3] - fields[4]  # all but idle and iowait
    postgres = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                text = stat.read()
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read().decode(errors="replace")
        except OSError:
            continue
        if not text[text.index("(") + 1 : text.rindex(")")].startswith("postgres"):
            continue
        session = "(" in command or "[local]" in command
        if session and f" {DATABASE} " not in command:
            continue
        rest = text[text.rindex(")") + 2 :].split()
        postgres += int(rest[11]) + int(rest[12])
    return {
        "redis": float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
        "postgres": postgres / ticks,
        "machine": busy / ticks,
    }


# -- EXPLAIN ANALYZE of the claims -----------------------------------------------------------------------


def dibs_claim_statement(url: str, batch: int) -> tuple[str, dict[str, Any]]:
    """The claim statement dibs runs and its parameters, caught on the way to the driver (the claim it
    made is undone by the next refill)."""
    outbox = dibs.Outbox(url)
    caught: list[tuple[str, Any]] = []

    def catch(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if "dibs_picked" in statement:
            caught.append((statement, parameters))

    sa.event.listen(outbox.engine, "before_cursor_execute", catch)
    outbox.store.claim(outbox.engine, owner="explain", limit=batch, target=TARGET, lease_seconds=30.0)
    outbox.engine.dispose()
    return caught[0]


_HALF_PUBLISHED = [
    "UPDATE dibs_outbox SET status = 'published', published_at = statement_timestamp() "
    "WHERE id <= (SELECT min(id) + count(*) / 2 FROM dibs_outbox)",
]
#: States a drain passes through, committed and not vacuumed or analyzed (as during a trial here, where
#: autovacuum is off; elsewhere it may or may not have come by).
EXPLAIN_STATES = {
    "full backlog": [],
    "half published": _HALF_PUBLISHED,
    "half published, another relay holding a batch": [
        *_HALF_PUBLISHED,
        "UPDATE dibs_outbox SET status = 'processing', lease_expires_at = statement_timestamp() + interval '30 s' "
        "WHERE id IN (SELECT id FROM dibs_outbox WHERE status = 'pending' ORDER BY id LIMIT %(batch)s)",
    ],
}


def explain(url: str, batches: list[int], kinds: list[str]) -> list[dict[str, Any]]:
    """EXPLAIN (ANALYZE, BUFFERS) of dibs's own claim statement and of the floors' at each batch size, on
    the full backlog and on states a drain passes through; each claim rolled back."""
    found = []
    for batch in batches:
        refill(url)
        statements = {"dibs": dibs_claim_statement(url, batch)}
        for kind in kinds:
            if kind in RAW_CLAIMS:
                parameters = {"target": TARGET, "targets": [TARGET], "batch": batch, "owner": "explain"}
                statements[kind] = (RAW_CLAIMS[kind], parameters)
        for state, setup in EXPLAIN_STATES.items():
            refill(url)
            with psycopg_connect(url, autocommit=True) as conn:
                for step in setup:
                    conn.execute(step, {"batch": batch})
            for kind, (statement, parameters) in statements.items():
                with psycopg_connect(url) as conn:
                    plan = [row[0] for row in conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + statement, parameters)]
                    conn.rollback()
                total = next((line for line in plan if line.startswith("Execution Time")), "")
                found.append({"kind": kind, "batch": batch, "state": state, "execution": total, "plan": plan})
                print(f"  EXPLAIN ANALYZE {kind} claim, batch {batch}, {state}: {total}", flush=True)
    return found


# -- the run ---------------------------------------------------------------------------------------------


def parse_configs(text: str) -> list[dict[str, Any]]:
    configs = []
    for item in text.split(","):
        concurrency, batch = (int(part) for part in item.lower().split("x"))
        configs.append({"concurrency": concurrency, "batch": batch})
    return configs


def round_plan(kinds: list[str], configs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """One round: each dibs setting after the floors at its batch size (each floor once per batch size)."""
    plan: list[tuple[str, dict[str, Any]]] = []
    for config in configs:
        for kind in KINDS:
            if kind not in kinds:
                continue
            if kind == "dibs":
                plan.append((kind, config))
            elif all((k, s["batch"]) != (kind, config["batch"]) for k, s in plan):
                plan.append((kind, {"batch": config["batch"]}))
    return plan


def run(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the trials ``argv`` asks for; returns the results (also written to benchmarks/results)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000, help="N, the backlog of each trial")
    parser.add_argument("--aggregates", type=int, default=1_000, help="A: event i belongs to aggregate i %% A")
    parser.add_argument("--relays", default="1,2", help="relay process counts")
    parser.add_argument("--configs", default="1x500", help="dibs relay settings, concurrency x batch")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"of {', '.join(KINDS)}")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--trial-seconds", type=float, default=15.0, help="stop a trial after this long, measuring what it published"
    )
    parser.add_argument("--explain", action="store_true", help="also EXPLAIN ANALYZE the claims")
    parser.add_argument("--explain-only", action="store_true", help="only EXPLAIN ANALYZE the claims")
    parser.add_argument("--profile", type=Path, default=None, help="py-spy every dibs relay into this directory")
    options = parser.parse_args(argv)
    relay_counts = [int(r) for r in options.relays.split(",")]
    kinds = options.kinds.split(",")
    if set(kinds) - set(KINDS):
        parser.error(f"--kinds: unknown {sorted(set(kinds) - set(KINDS))}")
    configs = parse_configs(options.configs)
    if options.profile is not None:
        options.profile.mkdir(parents=True, exist_ok=True)
    began = time.time()
    load_before = os.getloadavg()
    url = bench_url()
    trials: list[Trial] = []
    plans: list[dict[str, Any]] = []
    own_database(create=True)
    try:
        prepared = prepare(url, options.events, options.aggregates)
        print(
            f"  {options.events:,} events across {options.aggregates:,} aggregates added through Outbox.add_many at "
            f"{prepared['add_many_events_per_second']:,.0f} events/s; payloads {prepared['payload_bytes_mean']:.0f} "
            "bytes on average",
            flush=True,
        )
        if options.explain or options.explain_only:
            plans = explain(url, sorted({config["batch"] for config in configs}), kinds)
        number = 0
        for relays in [] if options.explain_only else relay_counts:
            for _ in range(options.repeats):
                for kind, setting in round_plan(kinds, configs):
                    number += 1
                    result = trial(
                        kind,
                        url,
                        setting,
                        relays,
                        options.events,
                        options.aggregates,
                        number,
                        options.trial_seconds,
                        options.profile,
                    )
                    trials.append(result)
                    print(f"  {describe(result)}", flush=True)
    finally:
        own_database(create=False)
    load = {"start": load_before, "end": os.getloadavg()}
    return report(trials, plans, prepared, vars(options), time.time() - began, load)


def main(argv: list[str] | None = None) -> None:
    run(argv)


def describe(t: Trial) -> str:
    steps = []
    for process in t.processes:
        parts = [f"{step} {s['mean_ms']:.1f} ms x{s['calls']}" for step, s in process["steps"].items()]
        claims = process["steps"]["claim"]
        parts.append(f"{claims['mean_rows']:.0f} rows/claim, {claims['empty']} empty")
        steps.append(", ".join(parts))
    per_event = {name: seconds / max(t.events, 1) * 1e6 for name, seconds in t.cpu.items()}
    done = f"{t.events:,} of {t.backlog:,}, stopped" if t.capped else f"{t.events:,}"
    return (
        f"x{t.relays} {t.kind:<10}{t.setting:<10}{t.events_per_second:>9,.0f} events/s ({done}; "
        f"{t.duplicates} duplicates); CPU us/event: relays {per_event['relays']:.0f}, postgres "
        f"{per_event['postgres']:.0f}, redis {per_event['redis']:.0f}, machine {per_event['machine']:.0f} | "
        + " | ".join(steps)
    )


# -- the report ------------------------------------------------------------------------------------------


def table(trials: list[Trial]) -> list[dict[str, Any]]:
    """Per (relays, kind, setting): median events/s, every run, and dibs's ratio to each floor's median at
    the same batch size and number of relays."""
    rows = []
    cells = sorted(
        {(t.relays, t.kind, t.batch, t.concurrency, t.setting) for t in trials},
        key=lambda c: (c[0], KINDS.index(c[1]), c[2], c[3]),
    )
    for relays, kind, batch, concurrency, setting in cells:
        runs = [t for t in trials if (t.relays, t.kind, t.setting) == (relays, kind, setting)]
        middle = statistics.median(t.events_per_second for t in runs)
        ratios = {}
        for floor in ("raw", "raw-tuned"):
            values = [t.events_per_second for t in trials if (t.relays, t.kind, t.batch) == (relays, floor, batch)]
            if kind == "dibs" and values:
                ratios[floor] = middle / statistics.median(values)
        rows.append(
            {
                "relays": relays,
                "kind": kind,
                "setting": setting,
                "batch": batch,
                "concurrency": concurrency,
                "events_per_second": middle,
                "runs": [t.events_per_second for t in runs],
                "stopped": sum(t.capped for t in runs),
                "ratio_to": ratios,
                "duplicates": sum(t.duplicates for t in runs),
                "cpu_us_per_event": {
                    name: statistics.median(t.cpu[name] / max(t.events, 1) * 1e6 for t in runs) for name in runs[0].cpu
                },
            }
        )
    return rows


def versions() -> dict[str, str]:
    return record.versions(("sqlalchemy", "psycopg", "psycopg-binary", "redis", "hiredis"))


def servers() -> dict[str, Any]:
    """The servers' versions and the settings that bear on this benchmark."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    info = client.info("server")
    persistence = {"save": client.config_get("save").get("save"), "appendonly": client.config_get("appendonly")}
    client.close()
    with psycopg_connect(POSTGRES_URL, autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN ('shared_buffers', 'synchronous_commit', "
                "'fsync', 'autovacuum', 'jit', 'work_mem', 'max_wal_size', 'random_page_cost')"
            ).fetchall()
        )
    return {
        "postgresql": version,
        "postgresql_settings": settings,
        "redis": info["redis_version"],
        "redis_persistence": persistence,
    }


def report(
    trials: list[Trial],
    plans: list[dict[str, Any]],
    prepared: dict[str, Any],
    options: dict[str, Any],
    elapsed: float,
    load: dict[str, Any],
) -> dict[str, Any]:
    rows = table(trials)
    if rows:
        print("\nmedian events/s; ratios: dibs / each floor at the same batch size and number of relays")
        print(
            f"{'relays':>6}  {'kind':<10}{'batch':>6}{'conc':>6}{'median':>10}   {'runs':<28}"
            f"{'/raw':>7}{'/tuned':>7}{'dups':>6}  CPU us/event (relays, postgres, redis)"
        )
        for row in rows:
            runs = ", ".join(f"{r:,.0f}" for r in row["runs"]) + (" (stopped)" if row["stopped"] else "")
            ratios = [f"{row['ratio_to'][f]:.2f}" if f in row["ratio_to"] else "-" for f in ("raw", "raw-tuned")]
            concurrency = row["concurrency"] if row["kind"] == "dibs" else "-"
            cpu = row["cpu_us_per_event"]
            print(
                f"{row['relays']:>6}  {row['kind']:<10}{row['batch']:>6}{concurrency:>6}"
                f"{row['events_per_second']:>10,.0f}   {runs:<28}{ratios[0]:>7}{ratios[1]:>7}{row['duplicates']:>6}  "
                f"{cpu['relays']:.0f}, {cpu['postgres']:.0f}, {cpu['redis']:.0f}"
            )
    verdicts = []
    best = max(
        (r for r in rows if r["kind"] == "dibs" and r["relays"] == GOAL_RELAYS),
        key=lambda r: r["events_per_second"],
        default=None,
    )
    if best is not None:
        rate = best["events_per_second"]
        verdicts.append(
            f"dibs with {GOAL_RELAYS} relays: best median {rate:,.0f} events/s ({best['setting']}); "
            f"goal >= {GOAL:,.0f}: " + ("met" if rate >= GOAL else "MISSED")
        )
        print(f"\ngoal\n  {verdicts[-1]}")
    for plan in plans:
        print(f"\nEXPLAIN ANALYZE {plan['kind']} claim, batch {plan['batch']}, {plan['state']}:")
        print("\n".join(f"    {line}" for line in plan["plan"]))
    if options.get("profile"):
        for path in sorted(Path(options["profile"]).glob("*.txt")):
            print(f"\npy-spy {path.name}")
            print(summarize_profile(path))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"relay-{time.strftime('%Y%m%d-%H%M%S')}.json"
    options = {key: str(value) if isinstance(value, Path) else value for key, value in options.items()}
    results = {
        "benchmark": "relay",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_average": load},
        "versions": versions(),
        "servers": servers(),
        "options": options,
        "events": prepared,
        "seconds": elapsed,
        "table": rows,
        "goal": verdicts,
        "explain": plans,
        "trials": [asdict(t) | {"events_per_second": t.events_per_second} for t in trials],
    }
    out.write_text(json.dumps(results, indent=2, default=str))
    print(f"\nwritten to {out} after {elapsed / 60:.1f} minutes")
    written: dict[str, Any] = json.loads(out.read_text())  # the same JSON types for every caller
    return written


def summarize_profile(path: Path, top: int = 25) -> str:
    """The functions of a py-spy raw profile with the largest shares of the samples: on their own (self),
    then with what they call (inclusive)."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        samples = int(count)
        total += samples
        frames = []
        for frame in stack.split(";"):
            function, _, where = frame.partition(" (")
            frames.append(f"{function} ({where.split(':')[0].rsplit('/', 1)[-1]})")
        own[frames[-1]] += samples
        for frame in set(frames):
            inclusive[frame] += samples
    lines = [f"  {total} samples; self, then inclusive, % of samples"]
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in own.most_common(top)]
    lines.append("  --")
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in inclusive.most_common(top)]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
