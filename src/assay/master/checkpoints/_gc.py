"""Checkpoint garbage collection: which checkpoints survive a trial or experiment, and the
executor that deletes the rest from storage and marks them DELETED in the store.

The rule is Determined's (`ExperimentCheckpointsToGCRaw` in its master): a COMPLETED
checkpoint is kept when it is

- among the `save_trial_latest` newest of its trial (by batches; equal batches tie and are
  all kept), or
- among the `save_trial_best` best of its trial by the searcher metric, or
- among the `save_experiment_best` best of the whole experiment by the searcher metric;

and deleted otherwise. "Best" ranks the searcher metric recorded with the checkpoint (the
validation at the checkpoint's batch); a checkpoint without it (no validation at that
batch, or a NaN) ranks below every one that has it and is kept only as one of the latest.
Equal metrics are ordered by batches, then by trial id, then by the order the store lists
them, so each "best N" is exactly N checkpoints.

Determined applies the rule once, when the experiment ends. Assay also applies it when a
trial ends, to that trial's checkpoints only, ranking the experiment's best against every
checkpoint stored so far, running trials' included. That is safe: a checkpoint that is not
among the experiment's best N now can only fall further as trials report better ones, so
the end-of-experiment pass would delete it too, and keeping an ended trial's checkpoints
until the whole experiment ends would fill the disk on long searches. Checkpoints of trials
that have not ended are never candidates: a running, queued, paused or stopping trial
restores from its latest one.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

from assay.common.storage import (
    StorageError,
    StorageManager,
    checkpoint_uuid,
    earlier_storages,
    storage_for,
)
from assay.config import CheckpointStorageConfig, ExperimentConfig
from assay.master.checkpoints._storage_policy import StoragePolicy
from assay.master.lifecycle import TERMINAL_TRIAL
from assay.master.store import DELETED, CheckpointRecord, Store

log = logging.getLogger("assay.master")

COMPLETED = "COMPLETED"
# The trial states in which a trial will never run again (as in assay.master._state).


@dataclass(frozen=True)
class GCPolicy:
    """What survives garbage collection: the config's counts and the searcher's metric."""

    save_trial_best: int = 1
    save_trial_latest: int = 1
    save_experiment_best: int = 0
    metric: str = ""
    smaller_is_better: bool = True

    def __post_init__(self) -> None:
        for name in ("save_trial_best", "save_trial_latest", "save_experiment_best"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")

    @classmethod
    def from_config(cls, config: ExperimentConfig) -> GCPolicy:
        storage = config.checkpoint_storage
        return cls(
            save_trial_best=storage.save_trial_best,
            save_trial_latest=storage.save_trial_latest,
            save_experiment_best=storage.save_experiment_best,
            metric=config.searcher.metric,
            smaller_is_better=config.searcher.smaller_is_better,
        )


@dataclass(frozen=True)
class TrialCheckpoints:
    """One trial's checkpoints (as the store lists them) and whether the trial has ended."""

    trial_id: int
    checkpoints: Sequence[CheckpointRecord]
    ended: bool


def searcher_metric(checkpoint: CheckpointRecord, metric: str) -> float | None:
    """The searcher metric of `checkpoint`'s validation (the one at its batch, which the
    store reads with it); None when absent or not a number."""
    metrics = checkpoint.user_metadata.get("validation_metrics") or {}
    value = metrics.get(metric) if isinstance(metrics, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return None
    return float(value)


def checkpoints_to_delete(
    policy: GCPolicy, trials: Sequence[TrialCheckpoints], *, experiment_ended: bool
) -> set[str]:
    """The uuids of the COMPLETED checkpoints that `policy` says to delete now.

    Candidates are the checkpoints of ended trials, or of every trial once
    `experiment_ended`; see the module docstring for the rule. Pure: no I/O.
    """
    live = [
        (index, t, c)
        for t in trials
        for index, c in enumerate(t.checkpoints)
        if c.state == COMPLETED
    ]
    keep: set[str] = set()
    keep |= _best(policy, ((i, t.trial_id, c) for i, t, c in live), policy.save_experiment_best)
    for trial in trials:
        if not (trial.ended or experiment_ended):
            continue
        mine = [(i, trial.trial_id, c) for i, t, c in live if t is trial]
        keep |= _best(policy, mine, policy.save_trial_best)
        keep |= _latest([c for _, _, c in mine], policy.save_trial_latest)
    return {c.uuid for _, t, c in live if (t.ended or experiment_ended) and c.uuid not in keep}


def _best(
    policy: GCPolicy, entries: Iterable[tuple[int, int, CheckpointRecord]], n: int
) -> set[str]:
    if n <= 0 or not policy.metric:
        return set()
    sign = 1.0 if policy.smaller_is_better else -1.0
    scored = [
        (sign * value, c.total_batches, trial_id, index, c.uuid)
        for index, trial_id, c in entries
        if (value := searcher_metric(c, policy.metric)) is not None
    ]
    return {entry[-1] for entry in sorted(scored)[:n]}


def _latest(checkpoints: Sequence[CheckpointRecord], n: int) -> set[str]:
    if n <= 0:
        return set()
    newest = sorted({c.total_batches for c in checkpoints}, reverse=True)
    kept: set[str] = set()
    for batches in newest:
        # A rank, as Determined's SQL rank(): checkpoints at equal batches share one.
        if sum(1 for c in checkpoints if c.total_batches > batches) >= n:
            break
        kept |= {c.uuid for c in checkpoints if c.total_batches == batches}
    return kept


# --- the executor ------------------------------------------------------------------------


@dataclass(frozen=True)
class GCResult:
    """What one collection did.

    `deleted`: removed from storage (or found already gone) and marked DELETED.
    `missing`: of `deleted`, those whose files were already gone.
    `failed`: uuid -> why; those rows are left as they were, and a later run retries them
    (a record whose location is not where its storage keeps it fails every time: it needs
    an administrator).
    """

    deleted: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    failed: Mapping[str, str] = field(default_factory=dict)


class StorageCache:
    """One `StorageManager` per experiment storage config (and experiment, on shared_fs),
    so S3 clients are reused.

    `default_root` is the master's checkpoint root: the root of shared_fs storage that
    has no `host_path`.
    """

    def __init__(
        self,
        default_root: Path | None = None,
        *,
        cache: dict[str, StorageManager] | None = None,
        policy: StoragePolicy | None = None,
    ) -> None:
        """`policy`: the master's rule on what users' storage it reaches (None: any)."""
        self.default_root = default_root
        self.policy = policy
        self._managers: dict[str, StorageManager] = {} if cache is None else cache

    def of(
        self, config: CheckpointStorageConfig, experiment_id: int | None = None
    ) -> StorageManager:
        """The storage `config` describes, for experiment `experiment_id` (shared_fs: its
        own directory; None: the storage root itself). `StorageError` when it describes
        none, or one the policy keeps the master away from."""
        problem = self.policy.use_problem(config) if self.policy is not None else None
        if problem is not None:
            raise StorageError(problem)
        key = _storage_key(config, self.default_root, experiment_id)
        manager = self._managers.get(key)
        if manager is None:
            manager = storage_for(config, self.default_root, experiment_id=experiment_id)
            self._managers[key] = manager
        return manager

    def earlier(
        self, config: CheckpointStorageConfig, experiment_id: int
    ) -> tuple[StorageManager, ...]:
        """Where earlier layouts put experiment `experiment_id`'s checkpoints (shared_fs:
        the storage root, `<root>/<uuid>`), for deletion to find them there too."""
        if config.type != "shared_fs":
            return ()
        self.of(config, experiment_id)  # the same checks
        return earlier_storages(config, self.default_root, experiment_id=experiment_id)


def _storage_key(
    config: CheckpointStorageConfig, default_root: Path | None, experiment_id: int | None
) -> str:
    # Hashed: the key holds the credentials, which need not sit in the cache in clear.
    fields = (
        (config.type, str(config.host_directory or default_root), experiment_id)
        if config.type == "shared_fs"
        else (
            config.type,
            config.bucket,
            config.prefix,
            config.endpoint_url,
            config.region,
            config.access_key,
            config.secret_key,
        )
    )
    return hashlib.sha256(repr(fields).encode()).hexdigest()


def delete_checkpoint(
    store: Store,
    record: CheckpointRecord,
    storage: StorageManager,
    earlier: Sequence[StorageManager] = (),
) -> bool:
    """Delete one checkpoint's files from `storage`, then mark it DELETED; True if its
    files were gone.

    What is deleted is `storage`'s place for the record's uuid, or the place one of
    `earlier` (the storage's earlier layouts) kept it in when the record names that
    one, never the location the record names: a record whose location is anywhere else
    (forged by a trial) raises `StorageError` and nothing is touched. Raises whatever
    storage or the store raised; the row is marked only after the files are gone, so a
    failure leaves it as it was and a retry finishes the job.
    """
    uuid = checkpoint_uuid(record.uuid)
    holder = next((s for s in (storage, *earlier) if record.location == s.location(uuid)), None)
    if holder is None:
        raise StorageError(
            f"checkpoint {uuid} is recorded at {record.location!r}, not where its "
            f"experiment's storage keeps it ({storage.location(uuid)}); not deleted, its "
            "files are left as they are for an administrator to check"
        )
    found = holder.delete(uuid)
    store.set_checkpoint_state(uuid, DELETED)
    return not found


def delete_records(
    store: Store,
    records: Iterable[CheckpointRecord],
    config: CheckpointStorageConfig,
    storages: StorageCache,
    experiment_id: int,
    *,
    by_user: bool = False,
) -> GCResult:
    """Delete each of `records`, all of experiment `experiment_id` whose storage is
    `config`, collecting outcomes; never raises for one checkpoint. `by_user`: a user's
    deletion, which only versions of models in the checkpoint's own workspace stop
    (`Store.checkpoint_pins`); garbage collection keeps any registered checkpoint."""
    deleted: list[str] = []
    missing: list[str] = []
    failed: dict[str, str] = {}
    kept_by = store.checkpoint_pins if by_user else store.checkpoint_references
    for record in records:
        if kept_by([record.uuid]):
            # Registered since the caller chose it: a model version pins it now.
            log.info("checkpoint %s: registered as a model version; kept", record.uuid)
            continue
        try:
            gone = delete_checkpoint(
                store,
                record,
                storages.of(config, experiment_id),
                storages.earlier(config, experiment_id),
            )
        except Exception as e:
            failed[record.uuid] = str(e) or type(e).__name__
            log.warning("checkpoint %s: deletion failed: %s", record.uuid, failed[record.uuid])
            continue
        deleted.append(record.uuid)
        if gone:
            missing.append(record.uuid)
    return GCResult(tuple(deleted), tuple(missing), failed)


def collect(
    store: Store,
    experiment_id: int,
    config: ExperimentConfig,
    *,
    ended_trial_ids: Collection[int] = (),
    experiment_ended: bool = False,
    default_root: Path | None = None,
    storage_cache: dict[str, StorageManager] | None = None,
    policy: StoragePolicy | None = None,
) -> GCResult:
    """Garbage-collect experiment `experiment_id`'s checkpoints under its config's policy.

    Call it (in a background thread: it does storage I/O) after the store has recorded that
    trials ended (`ended_trial_ids`: the trials that just reached COMPLETED, CANCELED or
    ERROR) or that the experiment ended (`experiment_ended=True`: it reached COMPLETED,
    CANCELED or ERROR; all its trials are then candidates). Trials the store already shows
    in one of those states count as ended too, so a collection missed by a master restart is
    made up by the next one. The latest checkpoint of a trial the store shows in any other
    state is never deleted, whatever the caller says, nor is a checkpoint that a
    registered model version pins.

    Each checkpoint to delete is removed from the storage `config` describes (shared_fs: the
    directory `root/<experiment_id>/<uuid>`, or `root/<uuid>` for one recorded there
    before experiments had directories of their own, the root being `default_root` when
    the config has no host_path; s3: the objects under `prefix/<uuid>/`, with this
    process's credentials: the config's or AWS_*), then marked DELETED; files already gone
    count as deleted and missing. A failure (a record whose stored location is not that
    place included: it is never deleted) is logged and returned in `failed`, never raised,
    and leaves the row as it was. Running it again does nothing more. Errors reading the
    store do propagate.
    """
    trials = store.list_trials(experiment_id)
    ended = set(ended_trial_ids) | {t.id for t in trials if t.state in TERMINAL_TRIAL}
    protected = {
        t.latest_checkpoint for t in trials if t.latest_checkpoint and t.state not in TERMINAL_TRIAL
    }
    listed = [TrialCheckpoints(t.id, store.list_checkpoints(t.id), t.id in ended) for t in trials]
    doomed = checkpoints_to_delete(
        GCPolicy.from_config(config), listed, experiment_ended=experiment_ended
    )
    doomed -= protected
    doomed -= set(store.checkpoint_references(doomed))  # pinned by a model version
    records = [c for t in listed for c in t.checkpoints if c.uuid in doomed]
    if not records:
        return GCResult()
    storages = StorageCache(default_root, cache=storage_cache, policy=policy)
    result = delete_records(store, records, config.checkpoint_storage, storages, experiment_id)
    log.info("experiment %d: %s", experiment_id, gc_sentence(result))
    return result


def gc_sentence(result: GCResult) -> str:
    """`deleted 3 checkpoints its checkpoint_storage policy no longer keeps (1 was already
    gone); 1 could not be deleted and is retried later`: a collection, for the log."""
    count = len(result.deleted)
    text = (
        f"deleted {count} checkpoint{'s' if count != 1 else ''} its checkpoint_storage "
        "policy no longer keeps"
    )
    if result.missing:
        gone = len(result.missing)
        text += f" ({gone} {'was' if gone == 1 else 'were'} already gone)"
    if result.failed:
        text += f"; {len(result.failed)} could not be deleted and are tried again later"
    return text


def collect_later(
    executor: futures.Executor,
    store: Store,
    experiment_id: int,
    config: ExperimentConfig,
    *,
    ended_trial_ids: Collection[int] = (),
    experiment_ended: bool = False,
    default_root: Path | None = None,
    storage_cache: dict[str, StorageManager] | None = None,
    policy: StoragePolicy | None = None,
) -> Callable[[], None]:
    """What to run once an end is committed: `collect` on `executor`, off the master's
    lock, with failures logged rather than raised."""

    def run() -> None:
        try:
            result = collect(
                store,
                experiment_id,
                config,
                ended_trial_ids=ended_trial_ids,
                experiment_ended=experiment_ended,
                default_root=default_root,
                storage_cache=storage_cache,
                policy=policy,
            )
        except Exception:
            log.exception("checkpoint collection of experiment %d failed", experiment_id)
            return
        if result.deleted:
            log.debug(
                "experiment %d: deleted checkpoints %s", experiment_id, " ".join(result.deleted)
            )

    def submit() -> None:
        executor.submit(run)

    return submit


__all__ = [
    "GCPolicy",
    "GCResult",
    "StorageCache",
    "TrialCheckpoints",
    "checkpoints_to_delete",
    "collect",
    "collect_later",
    "delete_checkpoint",
    "delete_records",
    "searcher_metric",
]
