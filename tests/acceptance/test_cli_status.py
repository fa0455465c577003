"""`dibs status` shows the live workers, and warns of queued jobs that none of them can take."""

from __future__ import annotations

import threading
from pathlib import Path

import dibs
from tests.acceptance.cli import dibs as run_dibs
from tests.helpers import wait_until
from tests.queue.support import WorkerThread


def test_status_lists_live_workers_and_the_jobs_no_live_worker_can_take(database: str, tmp_path: Path) -> None:
    assert run_dibs(database, tmp_path, "init").returncode == 0
    release = threading.Event()
    app = dibs.App(database)

    @app.task(name="shop.greet")
    def greet(name: str) -> None:
        release.wait(20)

    script = dibs.App(database)

    @script.task(name="__main__.greet")
    def greet_from_script(name: str) -> None: ...

    script.enqueue_many(greet_from_script, [{"name": "ada"}, {"name": "grace"}])
    app.enqueue(greet, {"name": "alan"})
    worker = WorkerThread(
        dibs.Worker(app, name="status-worker", concurrency=2, poll=0.05, handle_signals=False)
    ).start()
    try:
        wait_until(app.workers, what="the worker to be listed")
        status = run_dibs(database, tmp_path, "status")
        assert status.returncode == 0, status.stderr
        out = status.stdout
        assert "live workers" in out
        worker_line = next(line for line in out.splitlines() if "status-worker" in line)
        assert "default" in worker_line
        assert "s ago" in worker_line
        assert "warning: queued jobs no live worker can take" in out
        stranded_line = next(line for line in out.splitlines() if "__main__.greet" in line)
        assert "2" in [cell.strip() for cell in stranded_line.split("│")]
        assert "has task '__main__.greet'" in stranded_line
        assert "shop.greet" not in out.split("warning:")[1]
    finally:
        release.set()
        worker.stop()
        app.engine.dispose()
        script.engine.dispose()
    stopped = run_dibs(database, tmp_path, "status").stdout
    assert "no live workers" in stopped
    assert "no worker is running" in stopped
