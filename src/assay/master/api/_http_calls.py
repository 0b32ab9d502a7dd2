"""Calling the gRPC `ApiServicer` from HTTP: context shims and status -> HTTP code.

The servicer's methods are written against a gRPC context and report failures through
`context.abort(code, details)`. Over HTTP they get a shim instead whose `abort` raises
`CallError`, as `_aio.SyncContext` does for the gRPC server: plain methods run on the
thread pool with `HttpContext`; coroutines and async generators (StreamTrialLogs) run on
the event loop with `AsyncHttpContext`, whose `abort` is a coroutine as grpc.aio's is.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
from collections.abc import AsyncIterator, Callable
from concurrent import futures
from typing import Any, NoReturn

import grpc
from google.protobuf.message import Message

from assay.master.api._status import CallAbortedError

log = logging.getLogger("assay.master")
INTERNAL_MESSAGE = "internal error; the master's log has details"
# The codes whose details are meant for the caller; any other is a 500 with a generic text.
HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.UNAVAILABLE: 503,
}


class CallError(CallAbortedError):
    """An RPC that ended with a status other than OK, as an HTTP status and message."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)
        self.code = code
        self.status = HTTP_STATUS.get(code, 500)
        self.message = details if self.status != 500 else INTERNAL_MESSAGE


class _Context:
    """The parts of a gRPC servicer context that do not depend on sync or async."""

    def __init__(self, peer: str, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self._peer = peer
        self._metadata = metadata
        self._active = True
        self._callbacks: list[Callable[[object], None]] = []

    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def is_active(self) -> bool:
        return self._active

    def add_done_callback(self, callback: Callable[[object], None]) -> None:
        self._callbacks.append(callback)

    def done(self) -> None:
        """The HTTP request is over (answered, or its client went away)."""
        if self._active:
            self._active = False
            for callback in self._callbacks:
                callback(self)


class HttpContext(_Context):
    """For a plain servicer method on the pool."""

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise CallError(code, details)


class AsyncHttpContext(_Context):
    """For a coroutine or async generator servicer method on the event loop."""

    async def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise CallError(code, details)


def grpc_peer(peername: Any) -> str:
    """An HTTP client's socket address in the form grpc's `context.peer()` gives."""
    if not isinstance(peername, tuple) or len(peername) < 2:
        return ""
    host, port = peername[0], peername[1]
    return f"ipv6:[{host}]:{port}" if ":" in str(host) else f"ipv4:{host}:{port}"


async def call_unary(
    servicer: object,
    rpc: str,
    request: Message,
    pool: futures.Executor,
    peer: str,
    metadata: tuple[tuple[str, str], ...] = (),
) -> Message:
    """The response of `servicer.<rpc>(request)`, or `CallError`."""
    method = getattr(servicer, rpc)
    try:
        if inspect.iscoroutinefunction(method):
            async_context = AsyncHttpContext(peer, metadata)
            try:
                result: Message = await method(request, async_context)
            finally:
                async_context.done()
            return result
        context = HttpContext(peer, metadata)
        call = contextvars.copy_context().run  # the caller the guard found goes along
        try:
            pending = asyncio.get_running_loop().run_in_executor(
                pool, call, method, request, context
            )
        except RuntimeError:  # the pool is shut down: the master is stopping
            raise CallError(grpc.StatusCode.UNAVAILABLE, "the master is shutting down") from None
        try:
            result = await pending
        finally:
            context.done()
        return result
    except CallError:
        raise
    except Exception:
        log.exception("HTTP call of %s failed", rpc)
        raise CallError(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE) from None


def call_stream(
    servicer: object,
    rpc: str,
    request: Message,
    peer: str,
    metadata: tuple[tuple[str, str], ...] = (),
) -> tuple[AsyncIterator[Message], AsyncHttpContext]:
    """The async generator of a server-streaming method (it raises `CallError` as it is
    iterated) and its context, whose `done()` the caller calls when the stream is over."""
    context = AsyncHttpContext(peer, metadata)
    stream: AsyncIterator[Message] = getattr(servicer, rpc)(request, context)
    return stream, context
