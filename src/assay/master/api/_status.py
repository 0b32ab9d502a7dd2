"""Domain errors -> gRPC status, in one place, so servicers stay thin.

A handler is decorated with `maps_errors` (a plain method, run on the thread pool),
`maps_errors_async` (a coroutine) or `maps_errors_stream` (an async generator): a
domain error it raises reaches the caller as its status and message, anything else as
INTERNAL with a generic message (the details go to the master's log).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Protocol, TypeVar

import grpc
from sqlalchemy.exc import DataError, OperationalError

from assay.errors import AssayError
from assay.master.errors import (
    AuthError,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitedError,
    ResourceExhaustedError,
    SchemaError,
    StaleRunError,
    StoreUnavailableError,
)

log = logging.getLogger("assay.master")
DATA_ERROR = "a value in the request cannot be stored or looked up (e.g. a NUL character)"
INTERNAL_ERROR = "internal error; the master's log has details"
STORE_UNAVAILABLE = (
    "the master could not write to its database and is shutting down; a restart resumes "
    "from the database (the master's log has details)"
)


class _Context(Protocol):
    """What the decorators need of a context: grpc's (sync or aio) or an HTTP shim's."""

    def abort(self, code: grpc.StatusCode, details: str) -> Any: ...


_S = TypeVar("_S")  # the servicer
_Q = TypeVar("_Q")  # the request (or request iterator)
_C = TypeVar("_C", bound=_Context)
_R = TypeVar("_R")  # the response


class CallAbortedError(Exception):
    """Raised by a context's `abort` where it is an ordinary exception (the HTTP shims):
    the call's status is set already, so it passes through the decorators untouched."""


_CODES: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (NotFoundError, grpc.StatusCode.NOT_FOUND),
    (InvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT),
    (StaleRunError, grpc.StatusCode.FAILED_PRECONDITION),
    (ConflictError, grpc.StatusCode.FAILED_PRECONDITION),
    (PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
    (AuthError, grpc.StatusCode.UNAUTHENTICATED),
    (RateLimitedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (ResourceExhaustedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (StoreUnavailableError, grpc.StatusCode.UNAVAILABLE),
    (SchemaError, grpc.StatusCode.FAILED_PRECONDITION),
    (AssayError, grpc.StatusCode.INVALID_ARGUMENT),
]
# What a context's abort raises: the status is on its way already.
_ABORTS = (CallAbortedError, grpc.aio.AbortError)


def status_of(error: BaseException) -> grpc.StatusCode:
    for kind, code in _CODES:
        if isinstance(error, kind):
            return code
    return grpc.StatusCode.INTERNAL


# SQLite's own OperationalError also covers mistakes a retry repeats (no such table or
# column, too many variables): only these pass, as does any lost connection.
_TRANSIENT_SQLITE = ("locked", "busy", "disk", "full", "i/o", "unable to open")


def _transient(error: OperationalError) -> bool:
    """A database trouble that may pass: a lost or refused connection, a locked or full
    SQLite file. A statement the database cannot run is a bug, answered INTERNAL."""
    if error.connection_invalidated:
        return True
    module = type(error.orig).__module__ if error.orig is not None else ""
    if not module.startswith("sqlite3"):
        return True  # psycopg's OperationalError: the connection or the server
    text = str(error.orig).lower()
    return any(word in text for word in _TRANSIENT_SQLITE)


def _answer(error: Exception) -> tuple[grpc.StatusCode, str]:
    """The status and public message for `error`; logged when it is not a domain error.
    Called in the `except` block, so the log has the traceback. A database's own words
    (statements, values, driver messages) stay in the log."""
    if isinstance(error, StoreUnavailableError):
        log.warning("answered UNAVAILABLE: %s", error)
        return grpc.StatusCode.UNAVAILABLE, STORE_UNAVAILABLE
    if isinstance(error, AssayError):
        return status_of(error), str(error)
    if isinstance(error, OperationalError) and _transient(error):
        # A lost connection, a full disk, a locked file: the database's trouble, not the
        # caller's. UNAVAILABLE makes the harness retry (its reports are deduplicated)
        # instead of failing the run and spending one of the trial's restarts.
        log.warning("answered UNAVAILABLE: a database write failed: %s", error, exc_info=True)
        return grpc.StatusCode.UNAVAILABLE, STORE_UNAVAILABLE
    if isinstance(error, DataError):
        # A value the database cannot hold (a NUL character, say): the caller's to fix.
        log.warning("a value could not be stored or looked up: %s", error)
        return grpc.StatusCode.INVALID_ARGUMENT, DATA_ERROR
    log.exception("internal error")
    return grpc.StatusCode.INTERNAL, INTERNAL_ERROR


def maps_errors(method: Callable[[_S, _Q, _C], _R]) -> Callable[[_S, _Q, _C], _R]:
    """For a plain handler: its errors become the call's status (`context.abort`)."""

    @functools.wraps(method)
    def handler(self: _S, request: _Q, context: _C) -> _R:
        try:
            return method(self, request, context)
        except _ABORTS:
            raise
        except Exception as e:
            code, message = _answer(e)
        context.abort(code, message)
        raise AssertionError("context.abort returned")  # it raises

    return handler


def maps_errors_async(
    method: Callable[[_S, _Q, _C], Coroutine[Any, Any, _R]],
) -> Callable[[_S, _Q, _C], Coroutine[Any, Any, _R]]:
    """For a coroutine handler (grpc.aio's `abort` is awaited)."""

    @functools.wraps(method)
    async def handler(self: _S, request: _Q, context: _C) -> _R:
        try:
            return await method(self, request, context)
        except _ABORTS:
            raise
        except Exception as e:
            code, message = _answer(e)
        await context.abort(code, message)
        raise AssertionError("context.abort returned")  # it raises

    return handler


def maps_errors_stream(
    method: Callable[[_S, _Q, _C], AsyncIterator[_R]],
) -> Callable[[_S, _Q, _C], AsyncIterator[_R]]:
    """For an async generator handler (a server stream): an error ends the stream with
    its status, after the items sent so far."""

    @functools.wraps(method)
    async def handler(self: _S, request: _Q, context: _C) -> AsyncIterator[_R]:
        items = method(self, request, context)
        try:
            async for item in items:
                yield item
            return
        except _ABORTS:
            raise
        except Exception as e:
            code, message = _answer(e)
        finally:
            await _aclose(items)
        await context.abort(code, message)

    return handler


async def _aclose(items: AsyncIterator[Any]) -> None:
    close = getattr(items, "aclose", None)
    if close is not None:
        await close()
