"""The web UI's built files, served at every path outside /api/.

The UI is a single-page app: a path that is no file (/experiments/7) gets index.html, so
every route can be shared and reloaded. Without a build, every such path answers with a
page that says which command builds it.
"""

from __future__ import annotations

import html
from pathlib import Path, PurePosixPath

from aiohttp import web

DEFAULT_UI_DIR = Path(__file__).resolve().parent.parent / "webui_dist"
BUILD_COMMAND = "cd webui && npm ci && npm run build"
_NOT_BUILT = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Assay</title></head>
<body style="font-family: sans-serif; max-width: 40em; margin: 4em auto">
<h1>Assay master</h1>
<p>The web UI is not built, so this master has none to serve (it looked in
<code>{where}</code>). Build it from the repository's root with</p>
<pre>{command}</pre>
<p>and restart the master. The JSON API is served meanwhile: see
<a href="/api/v1/openapi.json">/api/v1/openapi.json</a>.</p>
</body></html>
"""


class WebUi:
    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or DEFAULT_UI_DIR).resolve()

    @property
    def built(self) -> bool:
        return (self.root / "index.html").is_file()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if not self.built:
            page = _NOT_BUILT.format(
                where=html.escape(str(self.root)), command=html.escape(BUILD_COMMAND)
            )
            return web.Response(text=page, content_type="text/html", headers=_NO_CACHE)
        relative = PurePosixPath(request.match_info.get("tail", ""))
        if relative.parts and ".." not in relative.parts:
            file = (self.root / relative).resolve()
            if file.is_relative_to(self.root) and file.is_file():
                return web.FileResponse(file, headers=_HEADERS)
            if "." in relative.name:
                # A missing asset (a script, an image) is not a page: no index.html for it.
                raise web.HTTPNotFound(text="no such file", content_type="text/plain")
        return web.FileResponse(self.root / "index.html", headers=_NO_CACHE)


# The page keeps a session token in local storage: nothing but its own files may run in
# it, and no other site may frame it.
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "style-src 'self' 'unsafe-inline'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
_NO_CACHE = {"Cache-Control": "no-cache", **_HEADERS}
