"""`get_cluster_info()`: what a trial's process knows about its trial, as Determined's
`det.get_cluster_info()` tells it.

On a cluster it comes from the spec the agent wrote (`ASSAY_TRIAL_SPEC`); under
`assay trial run-local` from the spec run-local wrote (`ASSAY_LOCAL_SPEC`). A script run
with plain `python` gets None, as in Determined, and `assay.core.init()` then gives it
the local twins.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from assay.common.spec import ClusterSpec, LocalSpec, spec_from_env


@dataclass(frozen=True)
class TrialInfo:
    """The trial this process trains."""

    trial_id: int
    experiment_id: int
    trial_seed: int
    hparams: dict[str, Any]
    config: dict[str, Any]
    run_id: int = 0
    # `searcher.max_length` (or `max_time`) as the searcher counts it (epochs become
    # batches with `records_per_epoch`): how long the whole search may train a trial. The
    # searcher's current target for this trial is `core.searcher.get_target()`. 0 when
    # the config gives no length (a `single` search of a script that decides itself).
    max_length: int = 0

    @property
    def trial_run_id(self) -> int:
        return self.run_id

    @property
    def _config(self) -> dict[str, Any]:  # Determined's private name, used by its examples
        return self.config


@dataclass(frozen=True)
class ClusterInfo:
    """This process's trial, its allocation and where to resume from."""

    trial: TrialInfo
    # The uuid of the checkpoint to resume from (after a pause, a restart or an ASHA
    # promotion); None on a trial's first run.
    latest_checkpoint: str | None
    allocation_id: str
    master_url: str
    on_cluster: bool = True
    container_rank: int = 0
    task_type: str = "TRIAL"
    user_data: dict[str, Any] = field(default_factory=dict)

    @property
    def task_id(self) -> str:
        return self.allocation_id


def _max_length(config: dict[str, Any]) -> int:
    """The most the trial trains (`SearcherConfig.trial_length`) as the master counts it:
    batches (epochs converted with `records_per_epoch`), or the config's own number when
    it cannot be converted."""
    from assay.config import parse_config, searcher_in_batches
    from assay.errors import InvalidConfigError

    parsed = parse_config(config)
    if not parsed.searcher.max_length.bounded:
        return 0  # the config gives none: the script decides
    try:
        return searcher_in_batches(parsed).trial_length.value
    except InvalidConfigError:
        return parsed.searcher.trial_length.value


def info_from_spec(spec: ClusterSpec | LocalSpec) -> ClusterInfo:
    if isinstance(spec, ClusterSpec):
        latest = PurePosixPath(spec.restore_from).name if spec.restore_from else None
        trial = TrialInfo(
            trial_id=spec.trial_id,
            experiment_id=spec.experiment_id,
            trial_seed=spec.trial_seed,
            hparams=dict(spec.hparams),
            config=dict(spec.config),
            run_id=spec.run_id,
            max_length=_max_length(spec.config),
        )
        cross_rank = int(os.environ.get("GROUP_RANK", "0") or 0)
        return ClusterInfo(
            trial=trial,
            latest_checkpoint=latest,
            allocation_id=spec.allocation_id,
            master_url=spec.trial_api,
            container_rank=cross_rank,
        )
    trial = TrialInfo(
        trial_id=spec.trial_id,
        experiment_id=0,
        trial_seed=spec.trial_seed,
        hparams=dict(spec.hparams),
        config=dict(spec.config),
        max_length=_max_length(spec.config),
    )
    return ClusterInfo(
        trial=trial,
        latest_checkpoint=spec.latest_checkpoint,
        allocation_id="local",
        master_url="",
        on_cluster=False,
    )


@functools.cache
def get_cluster_info() -> ClusterInfo | None:
    """This trial's info on a cluster or under `assay trial run-local`; None otherwise."""
    spec = spec_from_env()
    return None if spec is None else info_from_spec(spec)


__all__ = ["ClusterInfo", "TrialInfo", "get_cluster_info", "info_from_spec"]
