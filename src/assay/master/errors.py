"""The master's domain errors, each with a message that says what to do.

The store, the core and the auth layer raise them; `_status.py` maps each to its gRPC
status (and the HTTP layer to its HTTP status) in one place.
"""

from __future__ import annotations

import math

from assay.errors import AssayError


class StoreError(AssayError):
    """Base class of the errors about stored things."""


class NotFoundError(StoreError):
    """The experiment, trial, checkpoint or user does not exist."""


class ConflictError(StoreError):
    """A write contradicts what is stored (e.g. a re-sent report with other values)."""


class CheckpointInUseError(ConflictError):
    """A checkpoint that a registered model version pins cannot be deleted."""


class StaleRunError(StoreError):
    """A report from a run of a trial that a newer run has replaced (a zombie process)."""


class InvalidArgumentError(StoreError):
    """A request's value is not allowed (an unknown sort column, a bad page size)."""


class SchemaError(StoreError):
    """The database schema is not one this release can use."""


class PermissionDeniedError(AssayError):
    """A call without the credentials its target needs (e.g. an allocation's token)."""


class StoreUnavailableError(AssayError):
    """The master could not write to its database and must be restarted."""


class AuthError(AssayError):
    """Not logged in, or a login failed (never saying which part was wrong)."""


class ResourceExhaustedError(AssayError):
    """A limit on what one user may hold at once was reached: retry once some is freed."""


class RateLimitedError(AssayError):
    """Too many failed logins for a user name or from an address: retry later."""

    def __init__(self, retry_after_s: float) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(f"too many failed logins; try again in {math.ceil(retry_after_s)} seconds")
