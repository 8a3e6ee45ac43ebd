"""What the router checks of every request before it routes it (``[serve]`` of
``models.toml``): API keys and CORS. The router's app and each front process's install the
same (:func:`middlewares`, :func:`install`), so a request is checked wherever it arrives.

* ``api_keys``: a request needs ``Authorization: Bearer KEY`` (or ``x-api-key: KEY``, what
  Anthropic's clients send) with one of them, else 401 with a JSON error; ``/health`` stays
  open (load balancers and ``systemd`` probes carry no key). The key goes no further: it is
  the router's, and a model's server (which may log headers) never sees it. No message shows
  a key.
* ``cors``: origins a browser page may call from (``"*"``: any). A preflight ``OPTIONS`` is
  answered 204 with the methods and headers asked, and every answer to an allowed origin
  (errors and streams too) carries ``Access-Control-Allow-Origin``.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from aiohttp.typedefs import Handler, Middleware

    from xpulaunch.llamacpp.router.options import ServeConfig

OPEN_PATHS = frozenset({"/health"})
KEY_HEADERS = ("authorization", "x-api-key")
_METHODS = "GET, POST, PUT, PATCH, DELETE, OPTIONS"
_MAX_AGE_S = "600"


def middlewares(serve: ServeConfig) -> list[Middleware]:
    """The middlewares to put before the router's own (outermost first)."""
    found: list[Middleware] = []
    if serve.cors:
        found.append(_preflight(serve.cors))
    if serve.api_keys:
        found.append(_auth(serve.api_keys))
    return found


def install(app: web.Application, serve: ServeConfig) -> None:
    """The CORS headers on every answer (set before its headers are sent: streams too)."""
    if not serve.cors:
        return
    origins = serve.cors

    async def add(request: web.Request, response: web.StreamResponse) -> None:
        allowed = _allowed(request, origins)
        if allowed is not None:
            response.headers["Access-Control-Allow-Origin"] = allowed
            response.headers["Vary"] = "Origin"

    app.on_response_prepare.append(add)


def _allowed(request: web.Request, origins: Sequence[str]) -> str | None:
    origin = request.headers.get("Origin")
    if origin is None:
        return None
    if "*" in origins:
        return "*"
    return origin if origin in origins else None


def _preflight(origins: Sequence[str]) -> Middleware:
    @web.middleware
    async def preflight(request: web.Request, handler: Handler) -> web.StreamResponse:
        asked = request.headers.get("Access-Control-Request-Method")
        if request.method != "OPTIONS" or asked is None:
            return await handler(request)
        if _allowed(request, origins) is None:
            return web.Response(status=403, text="origin not allowed\n")
        headers = {
            "Access-Control-Allow-Methods": _METHODS,
            "Access-Control-Allow-Headers": request.headers.get(
                "Access-Control-Request-Headers", "Authorization, Content-Type"
            ),
            "Access-Control-Max-Age": _MAX_AGE_S,
        }
        return web.Response(status=204, headers=headers)

    return preflight


def _auth(keys: Sequence[str]) -> Middleware:
    wanted = [k.encode() for k in keys]

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS or _has_key(request, wanted):
            return await handler(request)
        given = any(h in request.headers for h in KEY_HEADERS)
        why = "a wrong API key" if given else "no API key"
        message = f"{why}: send Authorization: Bearer KEY with a key of this router"
        # The router's error shape (proxy.error_response, which imports this module).
        body = {"error": {"message": message, "type": "authentication_error", "code": 401}}
        return web.json_response(body, status=401, headers={"WWW-Authenticate": "Bearer"})

    return auth


def _has_key(request: web.Request, wanted: Sequence[bytes]) -> bool:
    bearer = request.headers.get("Authorization", "")
    scheme, _, token = bearer.partition(" ")
    candidates = [token.strip()] if scheme.lower() == "bearer" else []
    candidates.append(request.headers.get("x-api-key", ""))
    # Every key compared in constant time, so the time taken does not say how much matched.
    found = False
    for given in candidates:
        for key in wanted:
            found |= hmac.compare_digest(given.encode(), key)
    return found
