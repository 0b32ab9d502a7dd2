"""`DeleteCheckpoints`: a user deletes checkpoints by uuid (`assay checkpoint delete`).

The servicer only converts: `delete_checkpoints(store, uuids)` checks every uuid first and
refuses the whole request (nothing deleted) when one is unknown (`NotFoundError`) or is the
latest checkpoint of a trial that has not ended (`ConflictError`, FAILED_PRECONDITION):
a queued, running, paused or stopping trial restores from it. Then each is deleted from
storage and marked DELETED, as garbage collection does (`assay.master._gc`); a checkpoint
already DELETED counts as deleted, files already gone count as missing, and a storage
failure is reported per checkpoint, leaving that one as it was.
"""

from __future__ import annotations

from collections.abc import Sequence

from assay.config import CheckpointStorageConfig, parse_config
from assay.errors import InvalidConfigError
from assay.master._gc import DELETED, GCResult, StorageCache, delete_records
from assay.master._state import TERMINAL_TRIAL
from assay.master.store import CheckpointRecord, ConflictError, InvalidArgumentError, Store
from assay.proto import api_pb2

MAX_UUIDS = 1000


def delete_checkpoints(store: Store, uuids: Sequence[str]) -> GCResult:
    """Delete the checkpoints `uuids` (see the module docstring); raise before any deletion."""
    wanted = list(dict.fromkeys(u.strip() for u in uuids))
    if not wanted or "" in wanted:
        raise InvalidArgumentError("give the uuid of each checkpoint to delete")
    if len(wanted) > MAX_UUIDS:
        raise InvalidArgumentError(f"at most {MAX_UUIDS} checkpoints per request")
    records = [store.get_checkpoint(uuid) for uuid in wanted]  # NotFoundError names it
    configs: dict[int, CheckpointStorageConfig | None] = {}
    to_delete: list[tuple[CheckpointRecord, int]] = []
    already: list[str] = []
    for record in records:
        if record.state == DELETED:
            already.append(record.uuid)
            continue
        trial = store.get_trial(record.trial_id)
        if trial.latest_checkpoint == record.uuid and trial.state not in TERMINAL_TRIAL:
            raise ConflictError(
                f"checkpoint {record.uuid} is the latest checkpoint of trial {trial.id}, which "
                f"is {trial.state} and would restore from it; delete it once the trial has "
                "ended (COMPLETED, CANCELED or ERROR)"
            )
        if trial.experiment_id not in configs:
            configs[trial.experiment_id] = _storage_config(store, trial.experiment_id)
        to_delete.append((record, trial.experiment_id))
    deleted: list[str] = list(already)
    missing: list[str] = []
    failed: dict[str, str] = {}
    for experiment_id in dict.fromkeys(e for _, e in to_delete):
        mine = [r for r, e in to_delete if e == experiment_id]
        result = delete_records(store, mine, StorageCache(configs[experiment_id]))
        deleted.extend(result.deleted)
        missing.extend(result.missing)
        failed.update(result.failed)
    return GCResult(tuple(deleted), tuple(missing), failed)


def _storage_config(store: Store, experiment_id: int) -> CheckpointStorageConfig | None:
    """The experiment's storage settings (for S3 credentials and endpoint), if readable."""
    try:
        return parse_config(store.get_experiment(experiment_id).config).checkpoint_storage
    except InvalidConfigError:
        return None


def delete_response(
    store: Store, request: api_pb2.DeleteCheckpointsRequest
) -> api_pb2.DeleteCheckpointsResponse:
    """The whole `DeleteCheckpoints` RPC, for the servicer to return inside `rpc_errors`."""
    result = delete_checkpoints(store, list(request.uuids))
    return api_pb2.DeleteCheckpointsResponse(
        deleted=list(result.deleted), missing=list(result.missing), failed=dict(result.failed)
    )
