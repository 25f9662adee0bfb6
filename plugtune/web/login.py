"""The login form for browser users when the console requires the API token."""

from __future__ import annotations

from urllib.parse import parse_qsl

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from plugtune.web.auth import COOKIE, safe_next, same_token, set_session
from plugtune.web.templating import templates

router = APIRouter(include_in_schema=False)


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, next: str | None = None) -> Response:  # noqa: A002 - ?next=
    if request.app.state.api_token is None:
        return RedirectResponse(safe_next(next), status_code=303)
    return _form(request, safe_next(next), error="", status_code=200)


@router.post("/login")
async def login(request: Request) -> Response:
    """Sign in with the token: a session cookie, then back to the page asked for (or the jobs)."""
    fields = dict(parse_qsl((await request.body()).decode("utf-8", "replace"), keep_blank_values=True))
    target = safe_next(fields.get("next"))
    token: str | None = request.app.state.api_token
    if token is None:
        return RedirectResponse(target, status_code=303)
    if not same_token(fields.get("token", ""), token):
        error = "the API token is wrong" if fields.get("token") else "enter the API token"
        return _form(request, target, error=error, status_code=401)
    response = RedirectResponse(target, status_code=303)
    set_session(response, token)
    return response


@router.post("/logout")
def logout() -> Response:
    """Sign out: the session cookie is removed and the login form shown."""
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return response


def _form(request: Request, target: str, *, error: str, status_code: int) -> HTMLResponse:
    context = {"next_url": target, "error": error}
    return templates.TemplateResponse(request, "login.html", context, status_code=status_code)
