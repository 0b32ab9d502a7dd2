"""Errors of the experiment store, each with a message that says what to do."""

from __future__ import annotations

from assay.errors import AssayError


class StoreError(AssayError):
    """Base class of the store's errors."""


class NotFoundError(StoreError):
    """The experiment, trial, checkpoint or user does not exist."""


class ConflictError(StoreError):
    """A write contradicts what is stored (e.g. a re-sent report with other values)."""


class StaleRunError(StoreError):
    """A report from a run of a trial that a newer run has replaced (a zombie process)."""


class InvalidArgumentError(StoreError):
    """A query parameter is not allowed (an unknown sort column, a bad page size)."""


class SchemaError(StoreError):
    """The database schema is not one this release can use."""
