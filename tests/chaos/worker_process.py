"""A real dibs worker in a process of its own that writes down what it does, and can kill itself where it hurts.

    python -m tests.chaos.worker_process URL --log-dir DIR --actor NAME
        [--die-at after-claim:P,mid-handler:P,before-complete:P] [--seed N]
        [--concurrency N] [--batch N] [--lease S] [--grace S]

Every claim, renewal, start, finish, completion and release goes to ``DIR/NAME.jsonl`` through a
:class:`~tests.chaos.history.Recorder` (see tests/chaos/history.py), so that the history checker can
tell what ran where. The app's :class:`~dibs.queue.store.JobStore` is replaced by :class:`DyingStore`,
which calls the real statements and records what came back; dibs itself is not touched.

``--die-at`` makes the process SIGKILL itself, each time with probability P: ``after-claim`` (a batch
was claimed and nothing of it started), ``mid-handler`` (half way through a job), ``before-complete``
(jobs returned, their success not yet written). A ``fault`` event (``killed``, with the point) is
recorded just before.

Tasks (all record ``started`` and ``finished``):

* ``chaos.work(n, ms)``: sync, sleeps ``ms``; ``chaos.awork(n, ms)``: the same, async;
* ``chaos.keyed(key, n, ms)``: sync, ordering key ``key``;
* ``chaos.slow(seconds)``: sleeps ``seconds`` on its first attempt only (a zombie's job);
* ``chaos.count(n, ms)`` and ``chaos.acount(n, ms)``: transactional, sync and async: nap ``ms`` as
  ``chaos.work`` does, then count the job in the ``chaos`` counter and the runs table in the job's
  transaction (last, so that the counter's row lock is held only until the commit);
* ``chaos.fail()``: always raises (3 attempts); ``chaos.hang()``: async, sleeps past its 0.3 s timeout
  (2 attempts); ``chaos.suicide()``: SIGKILLs its own process (2 attempts).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import random
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

import dibs
from dibs.lease import Lease
from tests.chaos.history import Recorder
from tests.chaos.recording import RecordingStore
from tests.queue.support import counters, runs

POINTS = ("after-claim", "mid-handler", "before-complete")
#: Attempts of the ordinary jobs: enough that self-inflicted kills never use them all up.
ATTEMPTS = 25
QUICK_RETRY = dibs.Retry(base=0.05, factor=2.0, jitter=0.0)


class Dice:
    """Whether to die at a point, by the probabilities given on the command line."""

    def __init__(self, spec: str, seed: int | None) -> None:
        self.odds: dict[str, float] = {}
        for part in filter(None, spec.split(",")):
            point, _, chance = part.partition(":")
            if point not in POINTS:
                raise SystemExit(f"unknown point {point!r}; known: {', '.join(POINTS)}")
            self.odds[point] = float(chance)
        self.random = random.Random(seed)

    def roll(self, point: str) -> bool:
        return self.random.random() < self.odds.get(point, 0.0)


def die(recorder: Recorder, point: str) -> None:
    """Record the fault, then SIGKILL this process: no cleanup, no release, no flush."""
    recorder.fault("killed", recorder.actor, point=point, pid=os.getpid())
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # not reached


class DyingStore(RecordingStore):
    """The recording job store (tests/chaos/recording.py) that kills its process, at the odds given, right
    after a claim and just before writing successes."""

    def __init__(self, engine: Engine, recorder: Recorder, dice: Dice) -> None:
        super().__init__(engine, recorder)
        self.dice = dice

    def claim(self, conn: Engine | Connection, **options: Any) -> list[Lease]:
        claimed = super().claim(conn, **options)
        if claimed and self.dice.roll("after-claim"):
            die(self.recorder, "after-claim")
        return claimed

    def succeed(
        self, conn: Engine | Connection, held: Sequence[Lease], results: Sequence[tuple[Lease, str]] = ()
    ) -> list[Lease]:
        if held and self.dice.roll("before-complete"):
            die(self.recorder, "before-complete")
        return super().succeed(conn, held, results)

    def succeed_in(self, conn: Connection, lease: Lease, result: str | None) -> bool:
        if self.dice.roll("before-complete"):
            die(self.recorder, "before-complete")
        return super().succeed_in(conn, lease, result)


def counted(conn: Connection, job_id: int) -> None:
    """A transactional chaos job's writes: one more on the ``chaos`` counter, and a line naming the job."""
    conn.execute(sa.update(counters).where(counters.c.name == "chaos").values(n=counters.c.n + 1))
    conn.execute(runs.insert().values(job_id=job_id, event="counted"))


def build_app(url: str, recorder: Recorder, dice: Dice) -> tuple[dibs.App, DyingStore]:
    app = dibs.App(dibs.create_engine(url))
    store = DyingStore(app.engine, recorder, dice)
    app._store = store  # the worker takes app.store

    def token_of(context: dibs.JobContext) -> int | None:
        return store.token_of(context.job_id)

    def traced(function: Callable[..., Any]) -> Callable[..., Any]:
        """Record started/finished (returned or raised) around a sync or async task function."""
        if asyncio.iscoroutinefunction(function):

            @functools.wraps(function)
            async def traced_async(*args: Any, context: dibs.JobContext, **kwargs: Any) -> Any:
                token = token_of(context)
                recorder.record("started", context.job_id, token=token, attempt=context.attempt)
                try:
                    result = await function(*args, context=context, **kwargs)
                except BaseException:
                    recorder.record("finished", context.job_id, token=token, outcome="raised")
                    raise
                recorder.record("finished", context.job_id, token=token, outcome="returned")
                return result

            return traced_async

        @functools.wraps(function)
        def traced_sync(*args: Any, context: dibs.JobContext, **kwargs: Any) -> Any:
            token = token_of(context)
            recorder.record("started", context.job_id, token=token, attempt=context.attempt)
            try:
                result = function(*args, context=context, **kwargs)
            except BaseException:
                recorder.record("finished", context.job_id, token=token, outcome="raised")
                raise
            recorder.record("finished", context.job_id, token=token, outcome="returned")
            return result

        return traced_sync

    def nap(ms: float) -> None:
        time.sleep(ms / 2000)
        if dice.roll("mid-handler"):
            die(recorder, "mid-handler")
        time.sleep(ms / 2000)

    @app.task(name="chaos.work", max_attempts=ATTEMPTS, retry=QUICK_RETRY)
    @traced
    def work(n: int, ms: float, context: dibs.JobContext) -> None:
        nap(ms)

    @app.task(name="chaos.awork", max_attempts=ATTEMPTS, retry=QUICK_RETRY)
    @traced
    async def awork(n: int, ms: float, context: dibs.JobContext) -> None:
        await asyncio.sleep(ms / 2000)
        if dice.roll("mid-handler"):
            die(recorder, "mid-handler")
        await asyncio.sleep(ms / 2000)

    @app.task(name="chaos.keyed", max_attempts=ATTEMPTS, retry=QUICK_RETRY, ordering_key="key")
    @traced
    def keyed(key: str, n: int, ms: float, context: dibs.JobContext) -> None:
        nap(ms)

    @app.task(name="chaos.slow", max_attempts=ATTEMPTS, retry=QUICK_RETRY)
    @traced
    def slow(seconds: float, context: dibs.JobContext) -> None:
        if context.attempt == 1:
            time.sleep(seconds)

    @app.task(name="chaos.count", max_attempts=ATTEMPTS, retry=QUICK_RETRY, transactional=True)
    @traced
    def count(n: int, ms: float, context: dibs.JobContext) -> None:
        nap(ms)
        counted(context.conn, context.job_id)

    @app.task(name="chaos.acount", max_attempts=ATTEMPTS, retry=QUICK_RETRY, transactional=True)
    @traced
    async def acount(n: int, ms: float, context: dibs.JobContext) -> None:
        await asyncio.sleep(ms / 2000)
        if dice.roll("mid-handler"):
            die(recorder, "mid-handler")
        await asyncio.sleep(ms / 2000)
        await context.conn.run_sync(counted, context.job_id)

    @app.task(name="chaos.fail", max_attempts=3, retry=QUICK_RETRY)
    @traced
    def fail(context: dibs.JobContext) -> None:
        raise RuntimeError(f"poison job {context.job_id} fails on attempt {context.attempt}")

    @app.task(name="chaos.hang", max_attempts=2, retry=QUICK_RETRY, timeout=0.3)
    @traced
    async def hang(context: dibs.JobContext) -> None:
        await asyncio.sleep(60)

    @app.task(name="chaos.suicide", max_attempts=2, retry=QUICK_RETRY)
    @traced
    def suicide(context: dibs.JobContext) -> None:
        die(recorder, "poison")

    return app, store


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--actor", required=True)
    parser.add_argument("--die-at", default="")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--lease", type=float, default=1.0)
    parser.add_argument("--grace", type=float, default=10.0)
    options = parser.parse_args()
    from pathlib import Path

    recorder = Recorder(Path(options.log_dir), options.actor)
    app, _store = build_app(options.url, recorder, Dice(options.die_at, options.seed))
    worker = dibs.Worker(
        app,
        name=options.actor,
        concurrency=options.concurrency,
        batch=options.batch,
        lease=options.lease,
        grace=options.grace,
        poll=0.05,
        upkeep_every=0.1,
    )
    recorder.record("worker", options.actor, state="started", pid=os.getpid())
    try:
        worker.run()
    finally:
        recorder.record("worker", options.actor, state="stopped", pid=os.getpid())
        app.engine.dispose()


if __name__ == "__main__":
    main()
