"""What drains in a trial: dibs's worker, the raw floor or a peer, one process of it each; and a trial's
measurements."""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import dibs
from benchmarks.floor import raw_drain
from dibs.runtime.collector import tuned_gc

BACKENDS = ("postgresql", "sqlite", "mariadb")
#: Set to "1" for the spawned worker processes when the run tunes their garbage collector (--gc).
GC_VARIABLE = "DIBS_BENCH_GC"


#: What the drained jobs return (``--returns``): None, a small dict (its result is kept), or a small dict
#: in 3-step chains (each step waits for the one before and reads its result).
RETURNS = ("none", "dict", "chain")
#: Set for the spawned worker processes to what the run's jobs return (--returns).
RETURNS_VARIABLE = "DIBS_BENCH_RETURNS"


def returns() -> str:
    """What the run's jobs return (the spawned workers read it from the environment, as ``--gc``)."""
    return os.environ.get(RETURNS_VARIABLE, "none")


def drain_app(url: str) -> dibs.App:
    """The app every dibs process uses: one async task that returns nothing, or a small dict."""
    app = dibs.App(url)
    if returns() == "none":

        @app.task(name="noop")
        async def noop(**_: Any) -> None:
            return None

    else:

        @app.task(name="noop")
        async def answer(**args: Any) -> dict[str, Any]:
            return {"ok": True, "order": args.get("order_id")}

    return app


# -- dibs ------------------------------------------------------------------------------------------


def dibs_drain(url: str, setting: dict[str, Any], owner: str, start: Any) -> tuple[int, float, dict[str, Any]]:
    app = drain_app(url)
    worker = app.worker(
        burst=True,
        concurrency=setting["concurrency"],
        batch=setting["batch"],
        poll=setting["poll"],
        connections=setting.get("connections"),
        handle_signals=False,
        name=owner,
        tune_gc=tuned(),  # with --gc, as `dibs worker` runs it; the other kinds get the same (see drain_process)
    )
    with contextlib.ExitStack() as opened:
        for _ in range(worker.connections):
            opened.enter_context(app.engine.connect())
    # The pool's connections, one per database thread of the worker, are made before the clock starts, as
    # every kind's are.
    start.wait()
    stats = worker.run()
    end = time.monotonic()
    app.engine.dispose()
    return stats.succeeded, end, asdict(stats)


# -- the peers ---------------------------------------------------------------------------------------

#: Every peer module in benchmarks/peers, by kind name; each is imported only when its kind is asked for.
PEERS = ("pgqueuer", "procrastinate", "huey", "graphile-worker", "pg-boss")
KINDS = ("raw", "dibs", *PEERS)


def peer(kind: str) -> Any:
    return importlib.import_module(f"benchmarks.peers.{kind.replace('-', '_')}")


def peer_settings(kind: str, text: str | None) -> list[dict[str, Any]]:
    module = peer(kind)
    return module.parse(text) if text else list(module.SETTINGS)


# -- running trials --------------------------------------------------------------------------------


def tuned() -> bool:
    """Whether the run tunes the garbage collector of every worker process (``--gc``), dibs's and the others'."""
    return os.environ.get(GC_VARIABLE) == "1"


class _Started:
    """The start barrier, noting the process's CPU time when it is passed; with ``--gc`` the objects made
    until then are frozen first, as dibs's tuned worker freezes them."""

    def __init__(self, barrier: Any) -> None:
        self.barrier = barrier
        self.cpu = 0.0

    def wait(self) -> None:
        if tuned():
            gc.freeze()
        self.barrier.wait()
        self.cpu = time.process_time()


def drain_process(
    kind: str, backend: str, url: str, setting: dict[str, Any], owner: str, start: Any
) -> tuple[int, float, dict[str, Any]]:
    """One worker process of a trial; its stats gain ``cpu_seconds``, the CPU time (every thread) it used
    from the start barrier to its return."""
    started = _Started(start)
    if kind == "dibs":
        done, end, stats = dibs_drain(url, setting, owner, started)
        return done, end, {**stats, "cpu_seconds": time.process_time() - started.cpu}
    with tuned_gc() if tuned() else contextlib.nullcontext():
        if kind == "raw":
            done, end, stats = raw_drain(backend, url, setting, owner, started)
        else:
            done, end, stats = peer(kind).drain(url, setting, started)
    # A Node peer's worker is a child process: its CPU time is its own, reported by its driver.
    cpu = time.process_time() - started.cpu + stats.pop("child_cpu_seconds", 0.0)
    return done, end, {**stats, "cpu_seconds": cpu}


@dataclass
class Trial:
    backend: str
    kind: str
    setting: str
    batch: int
    processes: int
    jobs: int
    seconds: float
    #: From the first claim to the last completion, on the database clock: the drain without worker
    #: start-up and shutdown (NaN where a peer keeps no such record).
    db_seconds: float
    #: When each process finished, in seconds after the barrier.
    ends: list[float] = field(default_factory=list)
    stats: list[dict[str, Any]] = field(default_factory=list)

    @property
    def jobs_per_second(self) -> float:
        return self.jobs / self.seconds

    @property
    def cpu_us_per_job(self) -> float:
        """The worker processes' CPU time per job, in microseconds (the database server's is not counted)."""
        return float(sum(stats["cpu_seconds"] for stats in self.stats)) / self.jobs * 1e6


def label(kind: str, setting: dict[str, Any]) -> str:
    if kind == "dibs":
        connections = f"/k{setting['connections']}" if setting.get("connections") else ""
        return f"c{setting['concurrency']}/b{setting['batch']}{connections}"
    if kind == "raw":
        return f"b{setting['batch']}"
    text: str = peer(kind).label(setting)
    return text
