"""What every page and action of one dashboard shares: its App and Outbox, its mode, and its templates."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import jinja2
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse

from dibs.dashboard.security import CSRF_COOKIE, CSRF_FIELD, csrf_token
from dibs.engine import shown_url
from dibs.outbox.outbox import Outbox
from dibs.queue.app import App

T = TypeVar("T")
TEMPLATES = Path(__file__).parent / "templates"


class Dashboard:
    """One dashboard's App, Outbox, mode and templates.

    Args:
        app: The App whose database the dashboard shows.
        read_only: Whether actions are refused (and not offered).
    """

    def __init__(self, app: App, *, read_only: bool) -> None:
        self.app = app
        self.outbox = Outbox(app.engine)
        self.read_only = read_only
        # Everything from the database is escaped: a job's arguments may hold markup.
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined
        )
        #: The database, its password hidden.
        self.database = shown_url(app.engine.url)

    async def threads(self, function: Any, *args: Any) -> Any:
        """Run a blocking read or write off the event loop."""
        return await run_in_threadpool(function, *args)

    def render(self, request: Request, template: str, context: dict[str, Any]) -> str:
        """A template rendered with what every page shows."""
        shared = {
            "request": request,
            "root": request.scope.get("root_path", ""),
            "read_only": self.read_only,
            "database": self.database,
            "csrf": csrf_token(request),
            "csrf_field": CSRF_FIELD,
        }
        return self.templates.get_template(template).render(**shared, **context)

    def page(self, request: Request, template: str, context: dict[str, Any], status: int = 200) -> HTMLResponse:
        """A rendered page, setting the CSRF cookie its forms send back."""
        token = csrf_token(request)
        response = HTMLResponse(self.render(request, template, context), status_code=status)
        if request.cookies.get(CSRF_COOKIE) != token:
            response.set_cookie(CSRF_COOKIE, token, httponly=True, samesite="strict", path="/")
        return response
