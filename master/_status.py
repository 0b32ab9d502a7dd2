"""Domain errors -> gRPC status, in one place, so servicers stay thin."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
from sqlalchemy.exc import DataError

from assay.errors import AssayError
from assay.master.errors import (
    AuthError,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitedError,
    SchemaError,
    StaleRunError,
    StoreUnavailableError,
)

log = logging.getLogger("assay.master")
DATA_ERROR = "a value in the request cannot be stored or looked up (e.g. a NUL character)"


_CODES: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (NotFoundError, grpc.StatusCode.NOT_FOUND),
    (InvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT),
    (StaleRunError, grpc.StatusCode.FAILED_PRECONDITION),
    (ConflictError, grpc.StatusCode.FAILED_PRECONDITION),
    (PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
    (AuthError, grpc.StatusCode.UNAUTHENTICATED),
    (RateLimitedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (StoreUnavailableError, grpc.StatusCode.UNAVAILABLE),
    (SchemaError, grpc.StatusCode.FAILED_PRECONDITION),
    (AssayError, grpc.StatusCode.INVALID_ARGUMENT),
]


def status_of(error: BaseException) -> grpc.StatusCode:
    for kind, code in _CODES:
        if isinstance(error, kind):
            return code
    return grpc.StatusCode.INTERNAL


@contextmanager
def rpc_errors(context: grpc.ServicerContext) -> Iterator[None]:
    """Turn a domain error into its status and public message; log anything else."""
    try:
        yield
    except AssayError as e:
        context.abort(status_of(e), str(e))
    except DataError:
        # A value the database cannot hold (a NUL character, say): the caller's to fix.
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, DATA_ERROR)
    except Exception:
        log.exception("internal error")
        context.abort(grpc.StatusCode.INTERNAL, "internal error; the master's log has details")
