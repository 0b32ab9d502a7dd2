"""The decorators that turn a handler's errors into its call's status."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator
from typing import Any, NoReturn

import grpc
import pytest
from sqlalchemy.exc import DataError, OperationalError

from assay.master.api import (
    DATA_ERROR,
    INTERNAL_ERROR,
    STORE_UNAVAILABLE,
    CallError,
    maps_errors,
    maps_errors_async,
    maps_errors_stream,
)
from assay.master.errors import ConflictError, NotFoundError, StoreUnavailableError


class Aborted(BaseException):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)
        self.code, self.details = code, details


class Context:
    """A sync context whose abort raises, as `_aio.SyncContext`'s does."""

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise Aborted(code, details)


class AsyncContext:
    async def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise Aborted(code, details)


ERRORS: list[tuple[Exception, grpc.StatusCode, str]] = [
    (NotFoundError("trial 7 does not exist"), grpc.StatusCode.NOT_FOUND, "trial 7 does not exist"),
    (ConflictError("it is COMPLETED"), grpc.StatusCode.FAILED_PRECONDITION, "it is COMPLETED"),
    # The database's words (here, a statement) stay in the master's log.
    (
        StoreUnavailableError("down (INSERT INTO experiments ...)"),
        grpc.StatusCode.UNAVAILABLE,
        STORE_UNAVAILABLE,
    ),
    (DataError("x", {}, Exception("NUL")), grpc.StatusCode.INVALID_ARGUMENT, DATA_ERROR),
    # A dropped connection or a full disk in a direct write: the harness retries
    # UNAVAILABLE; INTERNAL failed the trial's run and spent one of its restarts.
    (
        OperationalError("INSERT INTO metrics ...", {}, Exception("server closed the connection")),
        grpc.StatusCode.UNAVAILABLE,
        STORE_UNAVAILABLE,
    ),
    (
        OperationalError("UPDATE trials ...", {}, sqlite3.OperationalError("database is locked")),
        grpc.StatusCode.UNAVAILABLE,
        STORE_UNAVAILABLE,
    ),
    # SQLite's OperationalError for a statement no retry will mend: a bug, not an outage.
    (
        OperationalError("SELECT x ...", {}, sqlite3.OperationalError("no such column: x")),
        grpc.StatusCode.INTERNAL,
        INTERNAL_ERROR,
    ),
    (RuntimeError("a bug"), grpc.StatusCode.INTERNAL, INTERNAL_ERROR),
]


class Servicer:
    def __init__(self, error: BaseException | None) -> None:
        self.error = error

    @maps_errors
    def Plain(self, request: int, context: Context) -> int:  # noqa: N802
        if self.error is not None:
            raise self.error
        return request + 1

    @maps_errors_async
    async def Coroutine(self, request: int, context: AsyncContext) -> int:  # noqa: N802
        if self.error is not None:
            raise self.error
        return request + 1

    @maps_errors_stream
    async def Stream(self, request: int, context: AsyncContext) -> AsyncIterator[int]:  # noqa: N802
        yield request
        if self.error is not None:
            raise self.error
        yield request + 1


async def _drain(items: AsyncIterator[int], into: list[int]) -> None:
    async for item in items:
        into.append(item)


@pytest.mark.parametrize(("error", "code", "message"), ERRORS)
def test_each_kind_of_handler_answers_an_error_with_its_status(
    error: Exception, code: grpc.StatusCode, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    servicer = Servicer(error)
    with pytest.raises(Aborted) as plain:
        servicer.Plain(1, Context())
    with pytest.raises(Aborted) as coroutine:
        asyncio.run(servicer.Coroutine(1, AsyncContext()))
    sent: list[int] = []
    with pytest.raises(Aborted) as stream:
        asyncio.run(_drain(servicer.Stream(1, AsyncContext()), sent))
    for caught in (plain, coroutine, stream):
        assert (caught.value.code, caught.value.details) == (code, message)
    assert sent == [1]  # what was sent before the error stays sent
    # Only an unexpected error is logged (with its traceback), and never sent.
    internal = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(internal) == (3 if code == grpc.StatusCode.INTERNAL else 0)
    assert all(r.exc_info for r in internal)


def test_handlers_answer_as_before_when_nothing_fails() -> None:
    servicer = Servicer(None)
    assert servicer.Plain(1, Context()) == 2
    assert asyncio.run(servicer.Coroutine(1, AsyncContext())) == 2
    sent: list[int] = []
    asyncio.run(_drain(servicer.Stream(1, AsyncContext()), sent))
    assert sent == [1, 2]
    # grpc.aio and the thread pool tell handlers apart by kind: the kinds are kept.
    assert asyncio.iscoroutinefunction(Servicer.Coroutine)
    assert not asyncio.iscoroutinefunction(Servicer.Plain)
    assert Servicer.Plain.__name__ == "Plain"


@pytest.mark.parametrize(
    "abort",
    [CallError(grpc.StatusCode.UNAVAILABLE, "reply dropped"), Aborted(grpc.StatusCode.ABORTED, "")],
)
def test_an_abort_inside_a_handler_passes_through(abort: BaseException) -> None:
    """A handler that aborts by itself keeps its status: it is not an internal error."""
    servicer: Any = Servicer(abort)
    with pytest.raises(type(abort)) as caught:
        servicer.Plain(1, Context())
    assert caught.value is abort
    with pytest.raises(type(abort)) as caught:
        asyncio.run(servicer.Coroutine(1, AsyncContext()))
    assert caught.value is abort
