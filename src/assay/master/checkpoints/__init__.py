"""Checkpoints after they are reported: which ones survive (garbage collection), deleting
them from storage and the store, what storage a user's config may reach, and what a
trial's report of one may claim.
"""

from assay.master.checkpoints._checkpoints import (
    delete_checkpoints,
    delete_experiment,
    delete_response,
    normalise_uuids,
    recorded_sha256,
    reported_location,
    reported_metadata,
)
from assay.master.checkpoints._gc import (
    GCPolicy,
    GCResult,
    StorageCache,
    TrialCheckpoints,
    checkpoints_to_delete,
    collect,
    collect_later,
    delete_checkpoint,
    delete_records,
    searcher_metric,
)
from assay.master.checkpoints._storage_policy import StoragePolicy

__all__ = [
    "GCPolicy",
    "GCResult",
    "StorageCache",
    "StoragePolicy",
    "TrialCheckpoints",
    "checkpoints_to_delete",
    "collect",
    "collect_later",
    "delete_checkpoint",
    "delete_checkpoints",
    "delete_experiment",
    "delete_records",
    "delete_response",
    "normalise_uuids",
    "recorded_sha256",
    "reported_location",
    "reported_metadata",
    "searcher_metric",
]
