"""The SDK's errors: what the master answered, as one typed exception per kind of refusal."""

from __future__ import annotations

from assay.errors import AssayError

# The server's own words are the message for these (config problems, unknown ids, ...).
USER_CODES = frozenset(
    {
        "NOT_FOUND",
        "INVALID_ARGUMENT",
        "FAILED_PRECONDITION",
        "PERMISSION_DENIED",
        "UNAUTHENTICATED",
        "ALREADY_EXISTS",
        "RESOURCE_EXHAUSTED",
        "OUT_OF_RANGE",
        "ABORTED",
    }
)


class MasterError(AssayError):
    """The master refused a request or could not be reached; `code` names the gRPC status
    ("UNAUTHENTICATED", "UNAVAILABLE", ...)."""

    code: str | None = None


class NotFoundError(MasterError):
    """The experiment, trial, checkpoint or other record named does not exist."""


class AuthenticationError(MasterError):
    """No valid session: a wrong password, or a token that expired or was revoked."""


class ForbiddenError(MasterError):
    """The user may not do this (another user's experiment, an administrator's action)."""


class InvalidRequestError(MasterError):
    """The request itself is wrong: an invalid config, a bad value, an action that does
    not fit the record's state; the message says what to change."""


# The typed error each gRPC status becomes (any other: MasterError).
ERRORS: dict[str, type[MasterError]] = {
    "NOT_FOUND": NotFoundError,
    "UNAUTHENTICATED": AuthenticationError,
    "PERMISSION_DENIED": ForbiddenError,
    "INVALID_ARGUMENT": InvalidRequestError,
    "FAILED_PRECONDITION": InvalidRequestError,
    "ALREADY_EXISTS": InvalidRequestError,
    "OUT_OF_RANGE": InvalidRequestError,
}
