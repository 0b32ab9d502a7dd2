"""`DeleteCheckpoints`: a user deletes checkpoints by uuid (`assay checkpoint delete`);
`DeleteExperiment` (`assay experiment delete`): an ended experiment with its checkpoints.

The servicer only converts: `delete_checkpoints(store, uuids, user=...)` checks every uuid
first and refuses the whole request (nothing deleted) when one is not a uuid
(`InvalidArgumentError`), is unknown (`NotFoundError`), belongs to an experiment of another
user (`PermissionDeniedError`, unless the caller is an administrator), or is the latest
checkpoint of a trial that has not ended (`ConflictError`, FAILED_PRECONDITION): a queued,
running, paused or stopping trial restores from it; or is pinned by a version of a model
in the checkpoint's own workspace (`CheckpointInUseError`, naming the versions; a version
of another workspace's model never stops its deletion: it is marked as having lost its
checkpoint, and says so). Then each is deleted from its experiment's storage and marked
DELETED, as garbage collection does (`_gc`); a
checkpoint already DELETED counts as deleted, files already gone count as missing, and a
storage failure, or a record whose location is not where its experiment's storage keeps
it, is reported per checkpoint, leaving that one as it was.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from google.protobuf import struct_pb2

from assay.common.storage import StorageError, checkpoint_location, checkpoint_uuid
from assay.config import CheckpointStorageConfig, ExperimentConfig, parse_config
from assay.errors import InvalidConfigError
from assay.master.checkpoints._gc import GCResult, StorageCache, delete_records
from assay.master.checkpoints._storage_policy import StoragePolicy
from assay.master.errors import (
    CheckpointInUseError,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
)
from assay.master.lifecycle import TERMINAL_TRIAL
from assay.master.store import (
    DELETED,
    ENDED_EXPERIMENT,
    CheckpointRecord,
    ExperimentRecord,
    Store,
    pinned_message,
)
from assay.proto import api_pb2, common_pb2

MAX_UUIDS = 1000


def delete_checkpoints(
    store: Store,
    uuids: Sequence[str],
    *,
    user: str | None = None,
    default_root: Path | None = None,
    trial_id: int | None = None,
    policy: StoragePolicy | None = None,
) -> GCResult:
    """Delete the checkpoints `uuids` (see the module docstring); raise before any deletion.

    `user`: the caller, who may delete the checkpoints of their own experiments only; None
    for an administrator. `trial_id`: a trial's own call (the Core API), which may delete
    that trial's checkpoints only (another trial's are NOT_FOUND to it). `default_root`:
    the master's checkpoint root, where shared_fs storage without a host_path keeps
    checkpoints.
    """
    wanted = normalise_uuids(uuids)
    records = [store.get_checkpoint(uuid) for uuid in wanted]  # NotFoundError names it
    if trial_id is not None:
        for record in records:
            if record.trial_id != trial_id:
                # As if it did not exist: a trial learns nothing of others' checkpoints.
                raise NotFoundError(
                    f"checkpoint {record.uuid} does not exist among this trial's checkpoints"
                )
    trials = {r.trial_id: store.get_trial(r.trial_id) for r in records}
    experiments = {t.experiment_id: store.get_experiment(t.experiment_id) for t in trials.values()}
    if user is not None:
        for experiment in experiments.values():
            _check_owner(experiment, user)
    _check_unpinned(store, wanted)

    to_delete: list[CheckpointRecord] = []
    already: list[str] = []
    for record in records:
        if record.state == DELETED:
            already.append(record.uuid)
            continue
        trial = trials[record.trial_id]
        if trial.latest_checkpoint == record.uuid and trial.state not in TERMINAL_TRIAL:
            raise ConflictError(
                f"checkpoint {record.uuid} is the latest checkpoint of trial {trial.id}, which "
                f"is {trial.state} and would restore from it; delete it once the trial has "
                "ended (COMPLETED, CANCELED or ERROR)"
            )
        to_delete.append(record)
    deleted: list[str] = list(already)
    missing: list[str] = []
    failed: dict[str, str] = {}
    storages = StorageCache(default_root, policy=policy)
    for experiment_id, experiment in experiments.items():
        mine = [r for r in to_delete if trials[r.trial_id].experiment_id == experiment_id]
        if not mine:
            continue
        config = _storage_config(experiment)
        if config is None:
            reason = f"experiment {experiment_id}'s config is unreadable: no storage to delete from"
            failed.update({r.uuid: reason for r in mine})
            continue
        result = delete_records(store, mine, config, storages, experiment_id, by_user=True)
        deleted.extend(result.deleted)
        missing.extend(result.missing)
        failed.update(result.failed)
    return GCResult(tuple(deleted), tuple(missing), failed)


def delete_experiment(
    store: Store,
    experiment_id: int,
    *,
    default_root: Path | None = None,
    policy: StoragePolicy | None = None,
    delete_rows: Callable[[int], None] | None = None,
) -> GCResult:
    """`DeleteExperiment`: delete an ended experiment, its checkpoints' files first.

    Refused, with nothing deleted, while the experiment has not ended (`ConflictError`:
    kill it, or wait for its end) or while a version of a model in the experiment's own
    workspace pins one of its checkpoints (`CheckpointInUseError`, naming the models and
    versions); versions of other workspaces' models are marked as having lost them.

    The files go first, best-effort, through garbage collection's own deletion
    (`delete_records`: each checkpoint is removed from the experiment's storage, then
    marked DELETED); then every row of the experiment goes in one store transaction
    (`Store.delete_experiment`, which checks both rules again under lock). A crash
    between the two leaves the experiment whole, some of its checkpoints DELETED as
    garbage collection leaves them, and the next `experiment delete` finishes. A
    checkpoint whose files could not be deleted is returned in `failed` (why, with its
    place), and its files are left there: the rows go all the same, so that an
    unreachable storage or a forged record cannot keep the experiment for ever.
    `delete_rows`: what deletes the rows (default `store.delete_experiment`; the master's
    `delete_experiment_rows`, which also refuses an experiment continued meanwhile).
    """
    record = store.get_experiment(experiment_id)
    if record.state not in ENDED_EXPERIMENT:
        advice = (
            "wait for it to end"
            if record.state.startswith("STOPPING")
            else f"kill it first (assay experiment kill {experiment_id})"
        )
        raise ConflictError(
            f"experiment {experiment_id} is {record.state}: {advice}; only an ended experiment "
            "(COMPLETED, CANCELED or ERROR) can be deleted"
        )
    records = [c for t in store.list_trials(experiment_id) for c in store.list_checkpoints(t.id)]
    pinned = store.checkpoint_pins([c.uuid for c in records])
    if pinned:
        rows = [(uuid, m, v) for uuid, versions in pinned.items() for m, v in versions]
        raise CheckpointInUseError(pinned_message(experiment_id, rows))
    deleted = [c.uuid for c in records if c.state == DELETED]
    live = [c for c in records if c.state != DELETED]
    result = GCResult()
    if live:
        config = _storage_config(record)
        if config is None:
            reason = "the experiment's config is unreadable: no storage to delete from"
            result = GCResult(failed={c.uuid: f"{reason} ({c.location})" for c in live})
        else:
            storages = StorageCache(default_root, policy=policy)
            result = delete_records(store, live, config, storages, experiment_id, by_user=True)
    (delete_rows or store.delete_experiment)(experiment_id)
    where = {c.uuid: c.location for c in live}
    failed = {
        uuid: why if where[uuid] in why else f"{why} (its files: {where[uuid]})"
        for uuid, why in result.failed.items()
    }
    return GCResult((*deleted, *result.deleted), result.missing, failed)


def normalise_uuids(uuids: Sequence[str]) -> list[str]:
    """`uuids` stripped, lowercased and deduplicated, in order; each must be a uuid."""
    wanted: list[str] = []
    for raw in uuids:
        text = raw.strip().lower()
        if not text:
            raise InvalidArgumentError("give the uuid of each checkpoint to delete")
        try:
            wanted.append(checkpoint_uuid(text))
        except StorageError as e:
            raise InvalidArgumentError(f"cannot delete checkpoint {raw.strip()!r}: {e}") from None
    wanted = list(dict.fromkeys(wanted))
    if not wanted:
        raise InvalidArgumentError("give the uuid of each checkpoint to delete")
    if len(wanted) > MAX_UUIDS:
        raise InvalidArgumentError(f"at most {MAX_UUIDS} checkpoints per request")
    return wanted


def _check_unpinned(store: Store, uuids: Sequence[str]) -> None:
    """Refuse (`CheckpointInUseError`) when a version of a model in the checkpoint's own
    workspace pins one of `uuids` (other workspaces' versions are marked instead)."""
    pinned = store.checkpoint_pins(uuids)
    if pinned:
        uuid, versions = next(iter(pinned.items()))
        named = ", ".join(f"model {m!r} version {v}" for m, v in versions)
        more = f" (and {len(pinned) - 1} more of them are)" if len(pinned) > 1 else ""
        raise CheckpointInUseError(
            f"checkpoint {uuid} is registered as {named}{more}: delete those versions "
            "(assay model delete-version) before deleting the checkpoint"
        )


def _check_owner(experiment: ExperimentRecord, user: str) -> None:
    if experiment.owner != user:
        raise PermissionDeniedError(
            f"experiment {experiment.id} belongs to {experiment.owner}: only they or an "
            "administrator may delete checkpoints of it"
        )


def _storage_config(experiment: ExperimentRecord) -> CheckpointStorageConfig | None:
    """The experiment's checkpoint storage, or None when its config no longer parses."""
    try:
        return parse_config(experiment.config).checkpoint_storage
    except InvalidConfigError:
        return None


def delete_response(
    store: Store,
    request: api_pb2.DeleteCheckpointsRequest,
    *,
    user: str | None,
    default_root: Path | None,
    policy: StoragePolicy | None = None,
) -> api_pb2.DeleteCheckpointsResponse:
    """The whole `DeleteCheckpoints` RPC, for the servicer to return inside `rpc_errors`;
    `user` and `default_root` as for `delete_checkpoints`."""
    result = delete_checkpoints(
        store, list(request.uuids), user=user, default_root=default_root, policy=policy
    )
    return api_pb2.DeleteCheckpointsResponse(
        deleted=list(result.deleted), missing=list(result.missing), failed=dict(result.failed)
    )


def reported_metadata(checkpoint: common_pb2.Checkpoint) -> dict[str, Any]:
    """The metadata a trial's checkpoint report carries (the dict the script stored it
    with), as plain JSON for the record's `metadata`: whole numbers as integers (a
    Struct holds every number as a double) and NaN or infinities as text, which no JSON
    column takes as numbers."""
    return {k: _plain(v) for k, v in sorted(checkpoint.user_metadata.fields.items())}


def _plain(value: struct_pb2.Value) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "struct_value":
        return {k: _plain(v) for k, v in sorted(value.struct_value.fields.items())}
    if kind == "list_value":
        return [_plain(v) for v in value.list_value.values]
    if kind == "number_value":
        number = value.number_value
        if not math.isfinite(number):
            return str(number)
        return int(number) if number.is_integer() and abs(number) <= _EXACT_INT else number
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    return None


_EXACT_INT = 2**53  # the largest run of integers a double holds exactly


def recorded_sha256(record: CheckpointRecord) -> dict[str, str]:
    """The sha256 of each of `record`'s files as its trial reported them, which a restore
    verifies the files against; empty when the record has none for some file (a checkpoint
    reported by an older Assay: the restore then trusts its manifest, with a warning)."""
    sha = record.user_metadata.get("sha256")
    if not isinstance(sha, dict) or set(sha) != set(record.files):
        return {}
    if not all(isinstance(v, str) and v for v in sha.values()):
        return {}
    return {str(name): str(value) for name, value in sha.items()}


def reported_location(
    store: Store,
    experiment_id: int,
    config: ExperimentConfig | None,
    checkpoint: CheckpointRecord,
    default_root: Path,
) -> str:
    """The location a trial's checkpoint report must give: the one its experiment's
    storage derives from the uuid and the experiment (shared_fs:
    `<root>/<experiment_id>/<uuid>`; `config`: the live experiment's, None when it ended
    and the stored one is read). `InvalidArgumentError` for a bad uuid or location."""
    if config is None:  # ended meanwhile: a late report of its last run
        config = parse_config(store.get_experiment(experiment_id).config)
    try:
        expected = checkpoint_location(
            config.checkpoint_storage,
            checkpoint_uuid(checkpoint.uuid),
            default_root,
            experiment_id=experiment_id,
        )
    except StorageError as e:
        raise InvalidArgumentError(f"checkpoint report refused: {e}") from None
    if checkpoint.location != expected:
        raise InvalidArgumentError(
            f"checkpoint report refused: checkpoint {checkpoint.uuid} of experiment "
            f"{experiment_id} must be at {expected}, not {checkpoint.location!r}"
        )
    return expected
