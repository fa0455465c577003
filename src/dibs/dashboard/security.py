"""Who may see the dashboard, and proof that an action was sent by its own page.

Authentication is a callable given the request, returning whether to let it through: the user's own (a
session check of their application), or :func:`token_auth` / :func:`basic_auth`, which the ``dibs
dashboard`` command offers. Every action is a POST carrying the CSRF token of a cookie set by the
dashboard's pages (a double-submit token): a form on another site cannot read the cookie, so it cannot
send the token.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import inspect
import secrets
from collections.abc import Awaitable, Callable

from starlette.requests import Request

#: A request's authentication: True lets it through. It may be a coroutine function.
Auth = Callable[[Request], "bool | Awaitable[bool]"]

CSRF_COOKIE = "dibs_csrf"
CSRF_FIELD = "csrf"
TOKEN_COOKIE = "dibs_token"


def token_auth(token: str) -> Auth:
    """Let through requests that present ``token``: ``Authorization: Bearer TOKEN``, or the cookie a first
    visit to ``/?token=TOKEN`` sets.

    Args:
        token: The secret; compared in constant time.

    Returns:
        An authentication hook for :func:`dibs.dashboard.create_app`.
    """
    expected = token.encode()

    def allowed(request: Request) -> bool:
        header = request.headers.get("authorization", "")
        given = header[7:] if header.lower().startswith("bearer ") else request.cookies.get(TOKEN_COOKIE, "")
        return hmac.compare_digest(given.encode(), expected)

    allowed.dibs_token = token  # type: ignore[attr-defined]
    return allowed


def basic_auth(user: str, password: str) -> Auth:
    """Let through requests with HTTP basic credentials ``user`` and ``password`` (the browser asks for them).

    Args:
        user: The user name.
        password: The password; compared in constant time.

    Returns:
        An authentication hook for :func:`dibs.dashboard.create_app`.
    """
    expected = f"{user}:{password}".encode()

    def allowed(request: Request) -> bool:
        header = request.headers.get("authorization", "")
        if not header.lower().startswith("basic "):
            return False
        try:
            given = base64.b64decode(header[6:], validate=True)
        except (binascii.Error, ValueError):
            return False
        return hmac.compare_digest(given, expected)

    allowed.dibs_basic = True  # type: ignore[attr-defined]
    return allowed


async def authenticated(auth: Auth | None, request: Request) -> bool:
    """Whether ``auth`` lets the request through (no hook: every request)."""
    if auth is None:
        return True
    verdict = auth(request)
    if inspect.isawaitable(verdict):
        verdict = await verdict
    return bool(verdict)


def csrf_token(request: Request) -> str:
    """The page's CSRF token: the cookie's, or a new one (the response sets it), the same all through a request."""
    token: str | None = getattr(request.state, "dibs_csrf", None)
    if token is None:
        token = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(32)
        request.state.dibs_csrf = token
    return token


def csrf_valid(request: Request, sent: object) -> bool:
    """Whether a POST carries the token of its cookie, and comes from this origin when the browser says."""
    cookie = request.cookies.get(CSRF_COOKIE, "")
    if not cookie or not isinstance(sent, str) or not hmac.compare_digest(cookie.encode(), sent.encode()):
        return False
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    return origin.rstrip("/") == f"{request.url.scheme}://{request.url.netloc}"
