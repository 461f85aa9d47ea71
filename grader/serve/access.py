"""Who is asking, and the locks on a request: the principal of a token (``Authorization: Bearer``) or of the session
cookie, a 401 or 403 otherwise; a request that changes state with the cookie (not a token, which no browser sends by
itself) must come from this site's own pages (:func:`same_origin`); a form that carries no file is read only up to
:data:`FORM_MAX_BYTES`; a message a redirect carries to the next page is signed (:func:`signed`)."""

from __future__ import annotations

import hashlib
import hmac
from typing import TYPE_CHECKING
from urllib.parse import urlencode, urlsplit

from starlette.exceptions import HTTPException
from starlette.requests import Request

from grader.serve import audit, tokens
from grader.serve.records import Principal

if TYPE_CHECKING:
    from grader.serve.service import Service

COOKIE = "grader_session"
FORM_MAX_BYTES = 8 << 10  # a login or a leaderboard choice: a token and a name
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def is_api(request: Request) -> bool:
    return request.url.path.startswith("/api/") or "authorization" in request.headers


def who(request: Request, *, instructor: bool = False) -> Principal:
    """The principal of the request (token or session), or a 401; with ``instructor``, a 403 for a student."""
    service: Service = request.app.state.service
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        who = tokens.authenticate(service.db, header[7:].strip())
    else:
        who = tokens.session_principal(service.db, request.cookies.get(COOKIE, ""))
        if who is not None and request.method not in SAFE_METHODS:
            same_origin(request)  # a browser sends the cookie with another site's form too
    if who is None:
        if header:  # a token that is not (or no longer) valid; an expired cookie is not worth an entry
            audit.record(service.db, audit.ANONYMOUS, "login-failed", "", f"API token from {client_address(request)}")
        raise HTTPException(401, "log in with your token")
    if instructor and not who.is_instructor:
        raise HTTPException(403, "this page is the instructor's")
    return who


def client_address(request: Request) -> str:
    return request.client.host if request.client else "unknown address"


def same_origin(request: Request) -> None:
    """A request posted with the session cookie must come from this site's own pages (the cookie is SameSite=Strict
    too: this is the second lock, and SameSite lets a sibling subdomain's page through). Browsers send ``Origin`` with
    every POST: one that is missing, ``null`` (a sandboxed frame, a redirect from another site) or another host's is
    refused."""
    origin = request.headers.get("origin")
    if not origin or origin == "null" or urlsplit(origin).netloc != request.headers.get("host", ""):
        raise HTTPException(403, "cross-site request refused: post from this site's own pages")


async def small_form(request: Request):
    """A form without a file, read only once its declared size is known to be small (the form parser would read any
    length into memory)."""
    length = request.headers.get("content-length")
    if length is None or not length.isdigit() or int(length) > FORM_MAX_BYTES:
        raise HTTPException(413, f"a form of at most {FORM_MAX_BYTES} bytes, with a Content-Length, is expected")
    return await request.form(max_files=0, max_fields=4)


def signed(service: Service, message: str) -> str:
    """The query string that carries ``message`` to the next page, signed so that no other link can put words
    there."""
    message = message[:300]
    return urlencode({"error": message, "sig": signature(service, message)})


def signature(service: Service, message: str) -> str:
    return hmac.new(f"grader-serve-message:{service.salt}".encode(), message.encode(), hashlib.sha256).hexdigest()
