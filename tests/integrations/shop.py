"""The test shop behind the FastAPI, Starlette and Flask recipes: orders and the job that sends their receipts,
enqueued in the request's SQLAlchemy session, and the web apps that serve it (a worker beside the ASGI apps,
started and stopped by their lifespan)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

import dibs

orders = sa.Table(
    "shop_orders",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("total_cents", sa.Integer, nullable=False),
)


@dataclass
class Shop:
    """The queue and its task, and the sessions requests write through, on one database."""

    queue: dibs.App
    sessions: sessionmaker[Session]
    url: str
    async_url: str


def make_shop(url: str, async_url: str = "") -> Shop:
    queue = dibs.App(url)

    @queue.task(name="shop.send_receipt")
    def send_receipt(order_id: int, seconds: float = 0.0) -> int:
        time.sleep(seconds)
        return order_id

    return Shop(queue, sessionmaker(queue.engine), url, async_url)


def prepare(shop: Shop) -> None:
    shop.queue.init()
    orders.create(shop.queue.engine, checkfirst=True)


@contextlib.asynccontextmanager
async def worker_beside(shop: Shop) -> AsyncIterator[dibs.Worker]:
    """A worker on the app's event loop for the app's lifetime; it stops gracefully with the app."""
    worker = shop.queue.worker(handle_signals=False, poll=0.1, grace=10.0)
    running = asyncio.create_task(worker.arun())
    try:
        yield worker
    finally:
        worker.stop()
        await running


def fastapi_app(shop: Shop) -> Any:
    from fastapi import Depends, FastAPI, HTTPException

    engine = dibs.create_async_engine(shop.async_url)
    sessions = async_sessionmaker(engine)

    async def session() -> AsyncIterator[AsyncSession]:
        async with sessions.begin() as current:
            yield current

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with worker_beside(shop) as worker:
            app.state.worker = worker
            yield
        await engine.dispose()

    api = FastAPI(lifespan=lifespan)

    @api.post("/orders/{order_id}")
    async def place(
        order_id: int,
        seconds: float = 0.0,
        refuse: bool = False,
        db: AsyncSession = Depends(session),  # noqa: B008 - FastAPI's way of declaring a dependency
    ) -> dict[str, int]:
        await db.execute(orders.insert().values(id=order_id, total_cents=990))
        job = await shop.queue.aenqueue("shop.send_receipt", {"order_id": order_id, "seconds": seconds}, conn=db)
        if refuse:
            raise HTTPException(status_code=409, detail="refused after the enqueue")
        return {"job": job.id}

    return api


def starlette_app(shop: Shop) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    engine = dibs.create_async_engine(shop.async_url)
    sessions = async_sessionmaker(engine)

    async def place(request: Request) -> JSONResponse:
        order_id = int(request.path_params["order_id"])
        try:
            async with sessions.begin() as db:
                await db.execute(orders.insert().values(id=order_id, total_cents=990))
                job = await shop.queue.aenqueue("shop.send_receipt", {"order_id": order_id}, conn=db)
                if request.query_params.get("refuse"):
                    raise LookupError("refused after the enqueue")
        except LookupError:
            return JSONResponse({"refused": order_id}, status_code=409)
        return JSONResponse({"job": job.id})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with worker_beside(shop):
            yield
        await engine.dispose()

    return Starlette(routes=[Route("/orders/{order_id:int}", place, methods=["POST"])], lifespan=lifespan)


def flask_app(shop: Shop) -> Any:
    from flask import Flask, g, request

    web = Flask(__name__)
    web.config["PROPAGATE_EXCEPTIONS"] = False

    def session() -> Session:
        if "db" not in g:
            g.db = shop.sessions()
            g.db.begin()
        db: Session = g.db
        return db

    @web.teardown_request
    def end(error: BaseException | None) -> None:
        db = g.pop("db", None)
        if db is not None:
            if error is None:
                db.commit()
            else:
                db.rollback()
            db.close()

    @web.post("/orders/<int:order_id>")
    def place(order_id: int) -> dict[str, int]:
        db = session()
        db.execute(orders.insert().values(id=order_id, total_cents=990))
        job = shop.queue.enqueue("shop.send_receipt", {"order_id": order_id}, conn=db)
        if request.args.get("refuse"):
            raise LookupError("refused after the enqueue")
        return {"job": job.id}

    return web


def _from_environment() -> Shop:
    return make_shop(os.environ.get("DIBS_DATABASE_URL", "sqlite:///shop.sqlite"))


def __getattr__(name: str) -> Any:
    # `dibs worker tests.integrations.shop:queue` runs the shop's worker apart, on $DIBS_DATABASE_URL.
    if name == "queue":
        return _from_environment().queue
    raise AttributeError(name)


@contextlib.asynccontextmanager
async def served(app: Any) -> AsyncIterator[Any]:
    """An HTTP client on the ASGI ``app``, in this process, with the app's lifespan run around it as a server
    runs it: startup before the first request, shutdown (awaited) after the last."""
    import httpx

    received: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    sent: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    await received.put({"type": "lifespan.startup"})
    lifespan = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}}, received.get, sent.put))
    started = await sent.get()
    assert started["type"] == "lifespan.startup.complete", started
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://shop") as client:
            yield client
    finally:
        await received.put({"type": "lifespan.shutdown"})
        stopped = await sent.get()
        await lifespan
        assert stopped["type"] == "lifespan.shutdown.complete", stopped
