"""The recipes of the FastAPI, Starlette and Flask how-tos, as running apps: a job exists if and only if the
request's session commits, a worker started beside the ASGI app by its lifespan runs it and stops gracefully
with the app (finishing the job it holds), and a worker run apart with `dibs worker` stops on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.helpers import wait_until
from tests.helpers.targets import ASYNC_DRIVERS, SYNC_DRIVERS, database_url
from tests.integrations.shop import Shop, fastapi_app, flask_app, make_shop, orders, prepare, served, starlette_app
from tests.queue.support import drop_everything

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sqlite", "postgresql"])
def shop(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Shop]:
    family: str = request.param
    url = database_url(request, family, SYNC_DRIVERS[family], tmp_path / "shop.sqlite")
    drop_everything(url)
    async_url = url.set(drivername=ASYNC_DRIVERS[family]).render_as_string(hide_password=False)
    made = make_shop(url.render_as_string(hide_password=False), async_url)
    prepare(made)
    yield made
    orders.drop(made.queue.engine, checkfirst=True)
    made.queue.engine.dispose()
    drop_everything(url)


def statuses(shop: Shop) -> dict[int, str]:
    return {job.args["order_id"]: job.status for job in shop.queue.jobs()}


async def eventually(condition: Any, what: str, timeout: float = 20.0) -> None:
    """Poll ``condition`` (a blocking check, run in a thread) without blocking the app's event loop."""
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(condition):
        assert time.monotonic() < deadline, f"timed out waiting: {what}"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("make_app", [fastapi_app, starlette_app], ids=["fastapi", "starlette"])
def test_an_asgi_app_enqueues_with_its_request_and_its_lifespan_worker_runs_the_job(shop: Shop, make_app: Any) -> None:
    async def scenario() -> None:
        async with served(make_app(shop)) as client:
            assert (await client.post("/orders/1")).status_code == 200
            assert (await client.post("/orders/2", params={"refuse": "1"})).status_code == 409
            await eventually(lambda: statuses(shop) == {1: "succeeded"}, "the worker beside the app ran the job")

    asyncio.run(scenario())
    with shop.queue.engine.connect() as conn:
        assert conn.scalars(sa.select(orders.c.id)).all() == [1], "the refused request's order rolled back too"


def test_the_lifespan_worker_finishes_its_running_job_as_the_app_shuts_down(shop: Shop) -> None:
    async def scenario() -> None:
        async with served(fastapi_app(shop)) as client:
            assert (await client.post("/orders/3", params={"seconds": 1.0})).status_code == 200
            await eventually(lambda: statuses(shop) == {3: "running"}, "the job started")

    asyncio.run(scenario())
    assert statuses(shop) == {3: "succeeded"}


def test_a_flask_request_enqueues_in_its_session_and_a_worker_apart_stops_on_sigterm(shop: Shop) -> None:
    client = flask_app(shop).test_client()
    assert client.post("/orders/4").json == {"job": 1}
    assert client.post("/orders/5?refuse=1").status_code == 500
    assert statuses(shop) == {4: "queued"}
    env = {**os.environ, "DIBS_DATABASE_URL": shop.url}
    worker = subprocess.Popen(
        [str(Path(sys.executable).with_name("dibs")), "worker", "tests.integrations.shop:queue"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(lambda: statuses(shop) == {4: "succeeded"}, what="the worker apart ran the job")
    finally:
        worker.send_signal(signal.SIGTERM)
        output = worker.communicate(timeout=30)[0]
    assert worker.returncode == 0, output
