"""The dashboard's actions: POST only, with the page's CSRF token, refused in read-only mode; each
redirects back to the page it was sent from."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlencode

import sqlalchemy as sa
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from dibs._errors import DibsError, InvalidArgument, JobNotFound
from dibs.dashboard.reads import JobFilter
from dibs.dashboard.security import CSRF_FIELD, csrf_valid
from dibs.dashboard.state import Dashboard
from dibs.dialects import backend_for
from dibs.engine import writing
from dibs.queue.app import App
from dibs.queue.dependencies import forget_parents
from dibs.schema import CANCELLED, DEAD, FINISHED, QUEUED, SCHEDULED, SUCCEEDED, jobs

#: The most jobs one action on a filtered selection changes.
SELECTION_LIMIT = 10_000


def _run_now(app: App, job_id: int) -> None:
    """A scheduled job (a delayed one, or a retry waiting) runs at once."""
    change = (
        sa.update(jobs)
        .where(jobs.c.id == job_id, jobs.c.status == SCHEDULED)
        .values(status=QUEUED, run_at=backend_for(app.engine.dialect).now())
    )
    with writing(app.engine) as conn:
        conn.execute(change)


def _delete(app: App, job_id: int) -> None:
    """A finished job is deleted, with its links to the jobs it waited for. The jobs waiting for it are
    settled first: once it is gone, nothing would queue (or cancel) them. InvalidArgument, saying why, for a
    job left as it is: no longer finished (retried since the page was shown), or one that a job enqueued
    since then waits for."""
    app.store.settle_children(app.engine, [job_id])
    with writing(app.engine) as conn:
        deleted = conn.execute(
            sa.delete(jobs).where(jobs.c.id == job_id, jobs.c.status.in_(FINISHED), jobs.c.has_children.is_(False))
        ).rowcount
        if deleted:
            forget_parents(conn, [job_id])
            return
    try:
        status = app.get(job_id).status
    except JobNotFound:
        return  # deleted meanwhile, by another page or a purge
    why = "a job enqueued after it waits for it" if status in FINISHED else f"it is {status} now"
    raise InvalidArgument(f"job {job_id} was not deleted: {why}; a finished job no job waits for can be")


JOB_ACTIONS: dict[str, Callable[[App, int], object]] = {
    "retry": App.retry,
    "cancel": App.cancel,
    "run-now": _run_now,
    "delete": _delete,
}


def _selected(app: App, chosen: JobFilter, states: tuple[str, ...]) -> list[int]:
    query = (
        sa.select(jobs.c.id)
        .where(*chosen.where(), jobs.c.status.in_(states))
        .order_by(jobs.c.id.desc())
        .limit(SELECTION_LIMIT)
    )
    with app.engine.connect() as conn:
        return list(conn.execute(query).scalars())


def _on_selection(app: App, action: str, chosen: JobFilter) -> int:
    """Apply a job action to every job of a filter that it applies to; returns how many."""
    states = {
        "retry": (DEAD, CANCELLED),
        "cancel": (SCHEDULED, QUEUED),
        "run-now": (SCHEDULED,),
        "delete": (SUCCEEDED, DEAD, CANCELLED),
    }[action]
    ids = _selected(app, chosen, states)
    kept = 0
    # Oldest first: a job's parents are older than it, so a workflow retried whole runs in its order.
    for job_id in sorted(ids):
        try:
            JOB_ACTIONS[action](app, job_id)
        except InvalidArgument:
            if action != "delete":
                raise
            kept += 1  # changed since it was selected: the others are still deleted
    if kept:
        raise InvalidArgument(
            f"deleted {len(ids) - kept} of {len(ids)} jobs; kept {kept} that changed meanwhile (retried, or "
            "waited for by a job enqueued since)"
        )
    return len(ids)


async def act(request: Request) -> Response:
    """Run the action the form names, on a job, a filtered selection, a queue, a periodic schedule, or an
    outbox event."""
    dashboard: Dashboard = request.app.state.dashboard
    if dashboard.read_only:
        return PlainTextResponse("this dashboard is read-only: actions are refused", status_code=403)
    form = await request.form()
    if not csrf_valid(request, form.get(CSRF_FIELD)):
        return PlainTextResponse("the form's CSRF token is missing or wrong: reload the page", status_code=403)
    action = str(form.get("action", ""))
    target = str(form.get("target", ""))
    back = str(form.get("back", "")) or "/"
    app, box = dashboard.app, dashboard.outbox
    try:
        if action in JOB_ACTIONS and target.isdigit():
            await dashboard.threads(JOB_ACTIONS[action], app, int(target))
        elif action in JOB_ACTIONS and target == "selection":
            fields = ("status", "queue", "task", "key", "text")
            chosen = JobFilter(**{name: str(form.get(name, "")) for name in fields})
            await dashboard.threads(_on_selection, app, action, chosen)
        elif action in ("pause", "resume"):
            await dashboard.threads(getattr(app, action), target)
        elif action in ("pause-periodic", "resume-periodic"):
            await dashboard.threads(getattr(app, action.replace("-", "_")), target)
        elif action in ("requeue", "discard") and target.isdigit():
            await dashboard.threads(getattr(box, action), [int(target)])
        else:
            return PlainTextResponse(f"unknown action {action!r}", status_code=400)
    except DibsError as error:
        return RedirectResponse(f"{_local(back)}{'&' if '?' in back else '?'}{urlencode({'error': str(error)})}", 303)
    return RedirectResponse(_local(back), status_code=303)


def _local(path: str) -> str:
    """``path`` if it is a path of this site: a redirect never leaves it."""
    return path if path.startswith("/") and not path.startswith("//") and "\\" not in path else "/"
