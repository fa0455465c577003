"""Searching the jobs' arguments for text reads a window of the newest ids below where the page starts, says
which, and goes on window by window to the oldest job; on every backend, and in Chromium."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

import dibs
from dibs.dashboard import reads
from tests.browser.support import serve
from tests.queue.database import QueueDatabase


def _jobs(app: dibs.App, count: int) -> list[int]:
    """``count`` jobs, every third one's arguments holding "needle"; their ids, oldest first."""

    @app.task(name="shop.find")
    def find(word: str) -> None: ...

    jobs = app.enqueue_many(find, [{"word": "needle" if n % 3 == 0 else "hay"} for n in range(count)])
    return [job.id for job in jobs]


def test_a_search_reads_one_window_at_a_time_down_to_the_oldest_job(qdb: QueueDatabase) -> None:
    ids = _jobs(qdb.app(), 30)
    needles = [job_id for n, job_id in enumerate(ids) if n % 3 == 0]
    chosen = reads.JobFilter(text="needle")
    found: list[int] = []
    windows = []
    before = None
    while True:
        page = reads.job_page(qdb.engine, chosen, before, window=10)
        found += [row.id for row in page.rows]
        assert page.next_before is None  # a window never holds more than a page of matches here
        assert page.searched is not None
        windows.append((page.searched.lowest, page.searched.highest))
        if page.searched.further is None:
            break
        before = page.searched.further
    assert found == sorted(needles, reverse=True)
    assert windows == [(ids[-1] - 9 - 10 * n, ids[-1] - 10 * n) for n in range(3)]
    assert windows[-1][0] <= ids[0]
    unfiltered = reads.job_page(qdb.engine, reads.JobFilter(), None, window=10)
    assert unfiltered.searched is None  # only a text search is windowed
    assert len(unfiltered.rows) == 30


@pytest.fixture
def app(dashboard_url: sa.URL) -> Iterator[dibs.App]:
    app = dibs.App(dibs.create_engine(dashboard_url))
    yield app
    app.engine.dispose()


def test_the_jobs_page_says_what_it_searched_and_searches_older_jobs_on_request(
    app: dibs.App, page: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reads, "SEARCH_WINDOW", 10)
    ids = _jobs(app, 15)
    served = serve(app)
    try:
        page.goto(f"{served.url}/jobs?text=needle")
        said = page.locator("#searched").inner_text()
        assert f"Searched the arguments of jobs {ids[-10]} to {ids[-1]}" in said
        assert "older jobs are not searched yet" in said
        assert page.locator("#jobs tbody tr[data-job]").count() == 3  # of the newest ten
        page.click("#further")
        assert f"jobs {ids[0]} to {ids[-11]}: no older job is left" in page.locator("#searched").inner_text()
        assert page.locator("#jobs tbody tr[data-job]").count() == 2
        assert page.locator("#further").count() == 0
    finally:
        served.stop()
