"""The master's HTTP server: the JSON API under /api/v1/ and the web UI's files.

Every API route calls the same `ApiServicer` method as the gRPC API, with a request
built from the URL (`_http_params`) and a response that is the proto message as JSON
(`json_format.MessageToDict`, proto field names, every field without presence printed).
The server runs on the master's event loop (aiohttp); plain servicer methods run on the
master's thread pool, coroutines and async generators on the loop (`_http_calls`).

Failures are JSON `{"error": "..."}` with the status `_http_calls.HTTP_STATUS` maps the
gRPC code to; bad input is a 4xx that names the parameter. Cross-origin requests get no
CORS headers, and a POST made from another site's page (its Origin is not this host) is
refused, so a page elsewhere cannot pause or kill experiments through the user's browser.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent import futures
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.http_exceptions import HttpProcessingError
from google.protobuf import json_format
from google.protobuf.message import Message

from assay.errors import AssayError
from assay.master.api._http_calls import (
    INTERNAL_MESSAGE,
    AsyncHttpContext,
    CallError,
    call_stream,
    call_unary,
    grpc_peer,
)
from assay.master.api._http_openapi import openapi_document
from assay.master.api._http_params import ParamError, build_body_request, build_request
from assay.master.api._http_routes import PREFIX, ROUTES, Route
from assay.master.api._http_ui import WebUi
from assay.master.auth import AUTH_HEADER, PUBLIC_RPC_NAMES, Guard, Principal, caller, calling_as
from assay.master.errors import AuthError
from assay.master.telemetry import FollowerLimit
from assay.proto import api_pb2

log = logging.getLogger("assay.master")
# aiohttp's own cap; each route reads at most its `max_body` (`_read_body`).
MAX_BODY_BYTES = max(route.max_body for route in ROUTES)
# How often a follower checks that its client is still there, and sends a comment line.
_POLL_S = 0.5
_KEEPALIVE_S = 15.0
_SHUTDOWN_S = 2.0
# A connection with no request under way for this long is closed: idle keep-alives
# and clients that never finish their headers (aiohttp's own default is an hour).
# Answers being written and followed logs are requests under way, never cut. The
# master's `http_idle_timeout_s` sets it.
IDLE_TIMEOUT_S = 30.0
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
GRPC_PORT_HEADER = "Assay-Grpc-Port"
# Prometheus's default metrics_path; outside /api, before the web UI's catch-all.
METRICS_PATH = "/metrics"


def to_json(message: Message) -> dict[str, Any]:
    """A message's JSON form: the same for every route, and what the OpenAPI schemas say."""
    data: dict[str, Any] = json_format.MessageToDict(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
        unquote_int64_if_possible=True,
    )
    return data


def error_response(status: int, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers or None)


class HttpServer:
    """`await start()`, then `port`, then `await stop()`; all on one event loop."""

    def __init__(
        self,
        api: object,
        pool: futures.Executor,
        host: str,
        port: int,
        guard: Guard,
        ui_dir: Path | None = None,
        grpc_port: int = 0,
        metrics: Callable[[], tuple[bytes, str]] | None = None,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        """`grpc_port`: the master's gRPC port, named to clients that call this one;
        `metrics`: the body and content type of a /metrics scrape (None: metrics off);
        `idle_timeout_s`: how long a connection with no request under way stays open."""
        self.api = api
        self.idle_timeout_s = idle_timeout_s
        self.metrics = metrics
        self.grpc_port = grpc_port
        self.pool = pool
        self.guard = guard
        self.host = host
        self.port = port
        self.ui = WebUi(ui_dir)
        self._closing = False
        self.followers = 0  # log streams open now (server-sent events)
        self._openapi = json.dumps(openapi_document())
        self.app = self._build_app()
        self._runner: web.AppRunner | None = None

    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[self._middleware])
        for route in ROUTES:
            app.router.add_route(route.method, route.url, self._handler(route))
        app.router.add_get(PREFIX + "/health", self._health)
        app.router.add_get(PREFIX + "/openapi.json", self._openapi_json)
        app.router.add_get(METRICS_PATH, self._metrics)
        # Everything outside /api is the UI's; unknown /api paths are the router's 404.
        app.router.add_get(r"/{tail:(?!api(?:/|$)).*}", self.ui.handle)
        return app

    async def start(self, ssl_context: ssl.SSLContext | None = None) -> None:
        """Listen on host:port: HTTPS with `ssl_context` (the master's `tls_cert`)."""
        runner = web.AppRunner(
            self.app,
            shutdown_timeout=_SHUTDOWN_S,
            access_log_class=_AccessLog,
            logger=_ProtocolLog(self),
            keepalive_timeout=self.idle_timeout_s,
        )
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, ssl_context=ssl_context)
        try:
            await site.start()
        except OSError as e:
            await runner.cleanup()
            raise AssayError(
                f"cannot serve HTTP on {self.host}:{self.port} ({e.strerror or e}); the port "
                "is in use or the address is not this machine's: pick another with --http-port"
            ) from None
        self._runner = runner
        self.port = int(runner.addresses[0][1])
        scheme = "https" if ssl_context is not None else "http"
        log.info("HTTP API and web UI on %s://%s:%d/", scheme, self.host, self.port)

    async def stop(self) -> None:
        """Stop listening, end log followers, and wait (briefly) for calls in flight."""
        self._closing = True
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    # -- routes --------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        # The CLI asks for this when it was pointed here instead of at the gRPC port.
        headers = {GRPC_PORT_HEADER: str(self.grpc_port)} if self.grpc_port else None
        return web.json_response({"status": "ok"}, headers=headers)

    async def _openapi_json(self, request: web.Request) -> web.Response:
        await self._credentials(request)
        return web.Response(text=self._openapi, content_type="application/json")

    async def _metrics(self, request: web.Request) -> web.Response:
        """Prometheus's scrape: the metrics token (`Guard.admit_scrape`), then the text
        format, rendered on the pool (it reads the master's snapshot under its lock)."""
        if self.metrics is None:
            raise CallError(
                grpc.StatusCode.NOT_FOUND,
                "this master serves no metrics: its `metrics` setting is off",
            )
        try:
            self.guard.admit_scrape(request.headers.get("Authorization", ""))
        except AuthError as e:
            raise CallError(grpc.StatusCode.UNAUTHENTICATED, str(e)) from None
        loop = asyncio.get_running_loop()
        body, content_type = await loop.run_in_executor(self.pool, self.metrics)
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def _credentials(
        self, request: web.Request
    ) -> tuple[tuple[tuple[str, str], ...], Principal]:
        """The request's session token as gRPC metadata and its user, once the guard has
        accepted it (it may read the database: on the pool); `CallError` (401) otherwise."""
        header = request.headers.get("Authorization", "")
        metadata = {AUTH_HEADER: header}
        try:
            who = await self.guard.principal_async(metadata, self.pool)
        except AuthError as e:
            raise CallError(grpc.StatusCode.UNAUTHENTICATED, str(e)) from None
        return ((AUTH_HEADER, header),), who

    def _handler(self, route: Route) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            public = route.descriptor.full_name in PUBLIC_RPC_NAMES
            metadata: tuple[tuple[str, str], ...] = ()
            who: Principal | None = None
            if not public:
                metadata, who = await self._credentials(request)
            with calling_as(who):  # the handler's `caller()`, as the gRPC guard sets it
                return await self._call(request, route, metadata)

        handle.__name__ = route.rpc
        return handle

    async def _call(
        self, request: web.Request, route: Route, metadata: tuple[tuple[str, str], ...]
    ) -> web.StreamResponse:
        """The route's call, its credentials accepted."""
        body = b""
        if request.method != "GET":  # POST, DELETE: a change
            _refuse_other_sites(request)
            body = await _read_body(request, route.max_body)
        path = dict(request.match_info)
        if route.body:
            message = build_body_request(
                route.request_class, path, request.query, body, route.taken
            )
        else:
            message = build_request(route.request_class, path, request.query, route.taken)
        for name, value in route.fixed:
            setattr(message, name, value)
        given = [name for name in route.one_of if name in request.query]
        if route.one_of and len(given) != 1:
            raise ParamError(
                "/".join(route.one_of), f"give exactly one of {' or '.join(route.one_of)}"
            )
        if route.streams:
            return await self._stream(request, route, message, metadata)
        response = await call_unary(
            self.api, route.rpc, message, self.pool, _peer(request), metadata
        )
        return web.json_response(to_json(response))

    async def _stream(
        self,
        request: web.Request,
        route: Route,
        message: Message,
        metadata: tuple[tuple[str, str], ...],
    ) -> web.StreamResponse:
        if getattr(message, "follow", False):
            return await self._follow(request, route, message, metadata)
        stream, context = call_stream(self.api, route.rpc, message, _peer(request), metadata)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        try:
            # A failure (404) comes before the first item: it is still a plain error.
            first = await anext(stream, None)
            await response.prepare(request)
            if first is not None:
                await response.write(b"[" + json.dumps(to_json(first)).encode())
                async for item in stream:
                    await response.write(b"," + json.dumps(to_json(item)).encode())
                await response.write(b"]")
            else:
                await response.write(b"[]")
            await response.write_eof()
        except (CallError, ConnectionError):
            if not response.prepared:
                raise
            # Too late for a status: the client sees a cut-off (invalid) JSON array.
        finally:
            context.done()
            await _aclose(stream)
        return response

    async def _follow(
        self,
        request: web.Request,
        route: Route,
        message: Message,
        metadata: tuple[tuple[str, str], ...],
    ) -> web.StreamResponse:
        """Server-sent events: `data: <JSON>` per item, `event: end` once the stream ends.
        Each line's id is the event id, so a reconnecting EventSource resumes after it."""
        last_seen = request.headers.get("Last-Event-ID", "")
        if last_seen.isascii() and last_seen.isdigit() and len(last_seen) < 19:
            after = max(getattr(message, "after_id", 0), int(last_seen))
            setattr(message, "after_id", after)  # noqa: B010 - any streaming request
        # The trial must exist before the stream starts: afterwards a 404 cannot be sent.
        trial_id = getattr(message, "trial_id", 0)
        trial = api_pb2.GetTrialRequest(id=trial_id)
        await call_unary(self.api, "GetTrial", trial, self.pool, _peer(request), metadata)
        # A follower over the user's bound is a 429 while a status can still be sent; the
        # stream itself holds the slot (and refuses, too late for a status, if a race
        # filled it meanwhile).
        followers = getattr(self.api, "log_followers", None)
        user = who.username if (who := caller()) is not None else ""
        if isinstance(followers, FollowerLimit) and user and followers.full(user):
            raise CallError(grpc.StatusCode.RESOURCE_EXHAUSTED, followers.refusal(user))
        stream, context = call_stream(self.api, route.rpc, message, _peer(request), metadata)
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            }
        )
        self.followers += 1
        try:
            await response.prepare(request)
            async for item in self._until_gone(request, response, stream, context):
                data = json.dumps(to_json(item))
                item_id = getattr(item, "id", None)
                event = f"id: {item_id}\ndata: {data}\n\n" if item_id else f"data: {data}\n\n"
                await response.write(event.encode())
            if context.is_active() and not self._closing:
                await response.write(b"event: end\ndata: {}\n\n")
                await response.write_eof()
        except CallError as e:
            with contextlib.suppress(ConnectionError):
                error = json.dumps({"error": e.message})
                await response.write(f"event: error\ndata: {error}\n\n".encode())
        except ConnectionError:
            pass  # the client went away mid-write
        finally:
            self.followers -= 1
            context.done()
        return response

    async def _until_gone(
        self,
        request: web.Request,
        response: web.StreamResponse,
        stream: AsyncIterator[Message],
        context: AsyncHttpContext,
    ) -> AsyncIterator[Message]:
        """The stream's items until it ends, its client goes or the server stops; the
        stream is closed on the way out, whichever it was."""
        pending: asyncio.Future[Message] | None = None
        try:
            quiet = 0.0
            while True:
                pending = asyncio.ensure_future(anext(stream))
                while not pending.done():
                    await asyncio.wait({pending}, timeout=_POLL_S)
                    transport = request.transport
                    if self._closing or transport is None or transport.is_closing():
                        context.done()
                        return
                    quiet += _POLL_S
                    if quiet >= _KEEPALIVE_S and not pending.done():
                        quiet = 0.0
                        await response.write(b": keep-alive\n\n")
                try:
                    item = pending.result()
                except StopAsyncIteration:
                    return
                pending = None
                quiet = 0.0
                yield item
        finally:
            if pending is not None and not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await pending
            await _aclose(stream)

    # -- errors --------------------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        api = request.path == "/api" or request.path.startswith("/api/")
        try:
            response = await handler(request)
        except ParamError as e:
            response = error_response(400, str(e))
        except CallError as e:
            response = error_response(e.status, e.message)
            if e.status == 401:
                response.headers["WWW-Authenticate"] = 'Bearer realm="assay"'
        except web.HTTPException as e:
            if not api or e.status < 400:
                raise
            response = _http_error(request, e)
        except Exception:
            log.exception("HTTP %s %s failed", request.method, request.path)
            response = error_response(500, INTERNAL_MESSAGE)
        if not response.prepared:
            response.headers.setdefault("X-Content-Type-Options", "nosniff")
        return response


async def start_http(
    api: object,
    pool: futures.Executor,
    host: str,
    port: int,
    guard: Guard,
    ui_dir: Path | None = None,
    grpc_port: int = 0,
) -> HttpServer:
    """Serve the HTTP API for `api` (an `ApiServicer`) on host:port; port 0 picks a free
    port (then `server.port`). Call on the event loop the server is to run on."""
    server = HttpServer(api, pool, host, port, guard, ui_dir, grpc_port)
    await server.start()
    return server


class _AccessLog(AbstractAccessLogger):
    """One DEBUG line per request: the web UI polls every few seconds, and a line for
    each poll at INFO would bury what people need to read."""

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.DEBUG)

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        self.logger.debug(
            "%s %s %s: %d in %.1f ms",
            request.remote,
            request.method,
            _logged_path(request),
            response.status,
            time * 1000,
        )


_SECRET_PARAM = re.compile(r"token|passw|secret|key|auth|credential", re.IGNORECASE)


def _logged_path(request: web.BaseRequest) -> str:
    """The path and query as logged: the value of a parameter whose name suggests a
    credential is masked (no route takes one, but a client may send it anyway)."""
    if not request.query_string:
        return request.path
    shown = [
        f"{name}={'********' if _SECRET_PARAM.search(name) else value}"
        for name, value in request.query.items()
    ]
    return f"{request.path}?{'&'.join(shown)}"


class _ProtocolLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's connection logger. Bytes that are not HTTP/1 (a gRPC client pointed at
    this port, a scanner) get one line saying what came, not a traceback; anything else
    goes to `aiohttp.server` as before."""

    def __init__(self, server: HttpServer) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})
        self.server = server

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        error = kwargs.get("exc_info")
        if not isinstance(error, HttpProcessingError):
            super().log(level, msg, *args, **kwargs)
            return
        peer = args[0] if args else "a client"
        if "PRI" in str(error) and self.server.grpc_port:
            log.info(
                "%s called the HTTP port %d with gRPC; the gRPC port is %d",
                peer,
                self.server.port,
                self.server.grpc_port,
            )
        else:
            log.debug("%s sent what is not HTTP/1 to port %d", peer, self.server.port)


def _peer(request: web.Request) -> str:
    transport = request.transport
    return grpc_peer(transport.get_extra_info("peername") if transport is not None else None)


async def _read_body(request: web.Request, limit: int) -> bytes:
    """The body, refused with 413 before it is read when it is declared longer than
    `limit`, or as soon as more than `limit` bytes have arrived."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise _TooLarge(limit)
    body = bytearray()
    while len(body) <= limit:
        more = await request.content.read(min(limit + 1 - len(body), 2**20))
        if not more:
            break
        body += more
    if len(body) > limit:
        raise _TooLarge(limit)
    return bytes(body)


class _TooLarge(web.HTTPRequestEntityTooLarge):
    def __init__(self, limit: int) -> None:
        super().__init__(max_size=limit, actual_size=limit + 1)
        self.limit = limit


def _refuse_other_sites(request: web.Request) -> None:
    """A browser names the page's origin on a POST; only this host's own pages may act."""
    origin = request.headers.get("Origin")
    cross = request.headers.get("Sec-Fetch-Site", "") in ("cross-site", "same-site")
    if cross or (origin is not None and urlsplit(origin).netloc != request.host):
        raise CallError(
            grpc.StatusCode.PERMISSION_DENIED,
            f"a page of {origin or 'another site'} may not act on this master",
        )


def _http_error(request: web.Request, e: web.HTTPException) -> web.Response:
    if e.status == 404:
        message = (
            f"no such route: {request.method} {request.path}; the routes are listed at "
            f"{PREFIX}/openapi.json"
        )
        return error_response(404, message)
    if e.status == 405:
        allowed = ", ".join(sorted(getattr(e, "allowed_methods", ()) or ()))
        message = f"{request.method} is not allowed on {request.path}; use {allowed}"
        return error_response(405, message, Allow=allowed)
    if e.status == 413:
        limit = getattr(e, "limit", MAX_BODY_BYTES)
        return error_response(413, f"the request body is over {limit} bytes for this route")
    return error_response(e.status, e.reason)


async def _aclose(stream: AsyncIterator[Message]) -> None:
    close = getattr(stream, "aclose", None)
    if close is not None:
        with contextlib.suppress(Exception):
            await close()
