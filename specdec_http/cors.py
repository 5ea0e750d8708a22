"""Cross-origin requests from browser UIs (CORS), for the origins an operator lists.

Off by default (no origins: no CORS headers, and a browser refuses cross-origin calls).
With `security.cors_allowed_origins`, a request whose `Origin` is listed ("*" = any) gets
`Access-Control-Allow-Origin` on its response, errors and streams included, and a browser's
preflight (OPTIONS with `Access-Control-Request-Method`) from such an origin is answered
204 before authentication: a preflight never carries the bearer token, the request after it
does. A preflight from an origin not listed goes on as any other request (401 / 405), with
no CORS headers, so the browser refuses the call.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.requests import Request
from starlette.responses import Response

ALLOWED_HEADERS = "authorization, content-type"
MAX_AGE_S = 600  # how long a browser may cache a preflight's answer


class Cors:
    """The CORS policy of the HTTP API: the allowed origins (empty = off)."""

    def __init__(self, allowed_origins: Iterable[str] = ()) -> None:
        self.allowed_origins = frozenset(allowed_origins)

    def allows(self, origin: str | None) -> bool:
        return origin is not None and ("*" in self.allowed_origins or origin in self.allowed_origins)

    def preflight(self, request: Request, methods: list[str]) -> Response | None:
        """The answer to an allowed origin's preflight (`methods`: those of the path), else None."""
        origin = request.headers.get("origin")
        if request.method != "OPTIONS" or "access-control-request-method" not in request.headers:
            return None
        if not self.allows(origin) or not methods:
            return None
        headers = {
            "Access-Control-Allow-Methods": ", ".join(methods),
            "Access-Control-Allow-Headers": request.headers.get("access-control-request-headers") or ALLOWED_HEADERS,
            "Access-Control-Max-Age": str(MAX_AGE_S),
        }
        response = Response(status_code=204, headers=headers)
        self.decorate(request, response)
        return response

    def decorate(self, request: Request, response: Response) -> Response:
        """Add the allow-origin headers when the request's origin is allowed."""
        origin = request.headers.get("origin")
        if self.allows(origin):
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Vary"] = "Origin"
        return response
