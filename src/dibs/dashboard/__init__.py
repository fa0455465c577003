"""The web dashboard (``pip install 'dibs-sql[dashboard]'``): jobs, workers, schedules and the outbox of one
database, and the actions an operator takes on them.

An ASGI application (Starlette, Jinja2 templates, htmx served from the package: no JavaScript build, nothing
fetched from elsewhere). Serve it with ``dibs dashboard``, or mount it in an application of your own::

    from fastapi import FastAPI
    import dibs.dashboard

    api = FastAPI()
    api.mount("/dibs", dibs.dashboard.create_app("postgresql+psycopg://localhost/shop", auth=is_staff))
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import Engine
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from dibs.dashboard import actions, pages
from dibs.dashboard.security import TOKEN_COOKIE, Auth, authenticated, basic_auth, token_auth
from dibs.dashboard.state import Dashboard
from dibs.queue.app import App

__all__ = ["Auth", "basic_auth", "create_app", "token_auth"]


class _Guard:
    """Lets a request through to the dashboard only when the authentication hook does."""

    def __init__(self, inner: ASGIApp, auth: Auth | None) -> None:
        self.inner = inner
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.auth is None:
            await self.inner(scope, receive, send)
            return
        request = Request(scope, receive)
        token = request.query_params.get("token")
        if token is not None and getattr(self.auth, "dibs_token", None) == token:
            # A first visit with the token: kept in a cookie, and taken out of the address bar.
            response: Response = RedirectResponse(request.url.remove_query_params("token"), status_code=303)
            response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict", path="/")
        elif await authenticated(self.auth, request):
            await self.inner(scope, receive, send)
            return
        else:
            headers = {"WWW-Authenticate": 'Basic realm="dibs"'} if getattr(self.auth, "dibs_basic", False) else {}
            response = PlainTextResponse("not allowed: this dashboard needs authentication", 401, headers=headers)
        await response(scope, receive, send)


def create_app(
    app_or_url: App | Engine | str | None = None, *, read_only: bool = False, auth: Auth | None = None
) -> ASGIApp:
    """The dashboard of one database, as an ASGI application to serve or to mount.

    Args:
        app_or_url: A :class:`dibs.App`, an Engine or a database URL; None for ``$DIBS_DATABASE_URL`` or the
            SQLite file ``dibs.sqlite``.
        read_only: Show everything, change nothing: no action is offered, and any sent is refused.
        auth: Called with each request (a Starlette ``Request``); the request is served only when it returns
            True (it may be a coroutine function). None lets every request through: keep such a dashboard
            on loopback, or behind your own authentication. :func:`token_auth` and :func:`basic_auth` make one.

    Returns:
        The ASGI application.

    Example:
        >>> import dibs.dashboard
        >>> dashboard = dibs.dashboard.create_app("sqlite:///dibs.sqlite", read_only=True)
    """
    app = app_or_url if isinstance(app_or_url, App) else App(app_or_url)
    routes = [
        Route("/", pages.overview),
        Route("/live/overview", pages.overview_fragment),
        Route("/workers", pages.workers),
        Route("/jobs", pages.job_list),
        Route("/jobs/{job_id:int}", pages.job_detail),
        Route("/live/jobs/{job_id:int}", pages.job_fragment),
        Route("/schedules", pages.schedules),
        Route("/outbox", pages.outbox),
        Route("/outbox/{event_id:int}", pages.event_detail),
        Route("/actions", actions.act, methods=["POST"]),
        Mount("/static", StaticFiles(directory=Path(__file__).parent / "static"), name="static"),
    ]
    starlette = Starlette(routes=routes)
    starlette.state.dashboard = Dashboard(app, read_only=read_only)
    return _Guard(starlette, auth)
