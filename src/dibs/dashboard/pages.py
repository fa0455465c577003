"""The dashboard's pages: each reads through the App, the Outbox or :mod:`dibs.dashboard.reads` and renders
a template (escaped throughout)."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from dibs._errors import EventNotFound, JobNotFound
from dibs.dashboard.reads import JobFilter, job_family, job_page, queue_lines, running_per_worker, throughput
from dibs.dashboard.state import Dashboard
from dibs.queue.periodic import schedule_status
from dibs.schema import ABANDONED, EVENT_STATES, FINISHED, LIVE, STATES


def _number(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


async def overview(request: Request) -> Response:
    """Per queue: jobs per state, paused or not, the oldest ready job's wait; the last hour's throughput."""
    return await _render(request, "overview.html", _overview_context)


async def overview_fragment(request: Request) -> Response:
    """The overview's live part, which the page polls."""
    return await _render(request, "overview_live.html", _overview_context)


def _overview_context(dashboard: Dashboard, request: Request) -> dict[str, Any]:
    app = dashboard.app
    statuses = queue_lines(app.engine)
    paused = set(app.paused())
    known = {status.queue for status in statuses}
    return {
        "statuses": statuses,
        "paused": paused,
        "idle_paused": sorted(paused - known),
        "states": LIVE,
        "chart": throughput(app.engine),
    }


async def workers(request: Request) -> Response:
    """The live workers from their registry."""

    def context(dashboard: Dashboard, _: Request) -> dict[str, Any]:
        app = dashboard.app
        return {"workers": app.workers(), "running": running_per_worker(app.engine)}

    return await _render(request, "workers.html", context)


async def job_list(request: Request) -> Response:
    """Jobs matching the filters, a page at a time, newest first."""

    def context(dashboard: Dashboard, request: Request) -> dict[str, Any]:
        params = request.query_params
        chosen = JobFilter(
            **{name: params.get(name, "").strip() for name in ("status", "queue", "task", "key", "text")}
        )
        found = job_page(dashboard.app.engine, chosen, _number(params.get("before")))
        return {
            "rows": found.rows,
            "filter": chosen,
            "next_before": found.next_before,
            "searched": found.searched,
            "states": STATES,
        }

    return await _render(request, "jobs.html", context)


async def job_detail(request: Request) -> Response:
    """Everything about one job."""
    return await _render(request, "job.html", _job_context)


async def job_fragment(request: Request) -> Response:
    """The live part of a job's page (state, actions, progress, timings), which the page polls while the job
    is not finished."""
    return await _render(request, "job_live.html", _job_context)


def _job_context(dashboard: Dashboard, request: Request) -> dict[str, Any]:
    job_id = int(request.path_params["job_id"])
    job = dashboard.app.get(job_id)
    return {
        "job": job,
        "arguments": json.dumps(job.args, indent=2, sort_keys=True),
        "family": job_family(dashboard.app.engine, job_id),
        "finished": FINISHED,
        # Actions in the live part return to the job's page, not to the fragment that drew them.
        "back": f"{request.scope.get('root_path', '')}/jobs/{job_id}",
    }


async def schedules(request: Request) -> Response:
    """Periodic schedules with their next and last slot."""
    return await _render(request, "schedules.html", lambda d, _: {"schedules": schedule_status(d.app.engine)})


async def outbox(request: Request) -> Response:
    """Events per target and state, and the abandoned ones with their errors."""

    def context(dashboard: Dashboard, _: Request) -> dict[str, Any]:
        box = dashboard.outbox
        return {
            "statuses": box.status(),
            "states": EVENT_STATES,
            "abandoned": box.events(status=ABANDONED, limit=50, newest_first=True),
        }

    return await _render(request, "outbox.html", context)


async def event_detail(request: Request) -> Response:
    """Everything about one outbox event."""

    def context(dashboard: Dashboard, request: Request) -> dict[str, Any]:
        event = dashboard.outbox.get(int(request.path_params["event_id"]))
        return {"event": event, "payload": json.dumps(event.payload, indent=2, sort_keys=True)}

    return await _render(request, "event.html", context)


async def _render(request: Request, template: str, build: Any) -> Response:
    dashboard: Dashboard = request.app.state.dashboard
    try:
        context = await dashboard.threads(build, dashboard, request)
    except (JobNotFound, EventNotFound) as error:
        return HTMLResponse(dashboard.render(request, "missing.html", {"message": str(error)}), status_code=404)
    return dashboard.page(request, template, context)
