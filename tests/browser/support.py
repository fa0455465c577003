"""What the dashboard tests share: a dashboard served by uvicorn in a thread, on a free loopback port."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
import uvicorn

import dibs
import dibs.dashboard
from dibs.schema import metadata
from tests.helpers import wait_until


def fresh_database(url: sa.URL) -> Iterator[sa.URL]:
    """``url`` with the dibs tables created afresh, dropped afterwards."""
    engine = sa.create_engine(url)
    try:
        metadata.drop_all(engine)
        dibs.migrate(engine)
        yield url
        metadata.drop_all(engine)
    finally:
        engine.dispose()


class Served:
    """A dashboard served on loopback until stopped; ``url`` is its address."""

    def __init__(self, app: Any) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started, timeout=10, what="the dashboard to listen")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def serve(app: dibs.App, **options: Any) -> Served:
    """``app``'s dashboard, served."""
    return Served(dibs.dashboard.create_app(app, **options))
