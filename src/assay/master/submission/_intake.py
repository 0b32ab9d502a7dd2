"""How an experiment comes into the master's memory: a submission checked, its row and
state made, an ended experiment made live again by `experiment continue`.

Values for the shell (`_core.Master`) to record under its lock; nothing here takes the
lock or calls back into the master.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml

from assay.config import ExperimentConfig, searcher_in_batches
from assay.master.checkpoints import StoragePolicy
from assay.master.errors import ConflictError, InvalidArgumentError
from assay.master.fleet import Fleet
from assay.master.lifecycle import ExperimentState, ExperimentStatus, TrialState
from assay.master.lifecycle import effects as fx
from assay.master.lifecycle import experiment as experiment_life
from assay.master.scheduler import Pools
from assay.master.searcher import Searcher
from assay.master.store import ExperimentRecord, ModelDefinition, Store, WriteBatch
from assay.master.submission._continue import continued_config
from assay.master.submission._submission import (
    PreparedExperiment,
    check_resource_pool,
    check_submission,
    new_searcher,
    seeded_text,
)


def prepare(
    config_yaml: str,
    model_definition: ModelDefinition,
    owner: str,
    *,
    pools: Sequence[str],
    storage_policy: StoragePolicy,
    store: Store,
) -> PreparedExperiment:
    """Check a submission; `InvalidArgumentError` says what to fix."""
    config, searcher = check_submission(config_yaml, model_definition)
    check_resource_pool(config, pools)
    problem = storage_policy.submission_problem(config.checkpoint_storage)
    if problem is not None:
        raise InvalidArgumentError(problem)
    owner_id = store.user_id(owner)
    text = seeded_text(config_yaml, config)
    return PreparedExperiment(config, model_definition, owner, owner_id, searcher, config_text=text)


def record(
    batch: WriteBatch,
    prepared: PreparedExperiment,
    experiment_id: int,
    state: ExperimentStatus,
    now: dt.datetime,
) -> ExperimentState:
    """Add the experiment's row to `batch`; return its state in memory."""
    config = prepared.config
    batch.add_experiment(
        experiment_id,
        name=config.name,
        owner_id=prepared.owner_id,
        config=dict(config.raw),
        model_definition=prepared.model_definition,
        state=state,
        description=config.description,
        labels=config.labels,
        priority=config.resources.priority,
        now=now,
        config_text=prepared.config_text,
        project_id=prepared.project_id,
    )
    return ExperimentState(
        experiment_id,
        config,
        state,
        config.resources.priority,
        prepared.searcher,
        owner=prepared.owner,
    )


def never_fits(config: ExperimentConfig, scheduler: Pools, fleet: Fleet) -> str | None:
    """Why the experiment's trials could not start even on this cluster idle (None when
    they can, once slots are free)."""
    resources = config.resources
    pool = resources.resource_pool or ""
    return scheduler.why_never(
        resources.slots_per_trial, fleet.slot_type(pool), pool, resources.agent_label or ""
    )


def continuation(
    record: ExperimentRecord, overrides: Mapping[str, Any]
) -> tuple[dict[str, Any], ExperimentConfig, Searcher]:
    """What an ended experiment continues with: its stored config with `overrides` laid
    over it (`_continue.continued_config`: as stored, and parsed) and a new searcher for
    that config. `ConflictError` or `InvalidArgumentError` say why it cannot."""
    experiment_life.check_action(record.id, record.state, "continue")
    raw, config = continued_config(record.id, record.config, overrides)
    return raw, config, new_searcher(config)


def continued(
    record: ExperimentRecord,
    raw: dict[str, Any],
    config: ExperimentConfig,
    searcher: Searcher,
    trials: Iterable[TrialState],
) -> tuple[ExperimentState, list[fx.Effect]]:
    """An ended experiment live again with `config` (`raw`: as stored), and the effects
    that store that config and make its first trial resume and train on to the config's
    length; `ConflictError` when it has no trial."""
    experiment = ExperimentState(
        record.id,
        config,
        ExperimentStatus(record.state),
        record.priority,
        searcher,
        progress=record.progress,
        owner=record.owner,
        needs_start=True,  # its searcher's first Create adopts the trial
    )
    for trial in trials:
        experiment.add_trial(trial)
    first = min(experiment.trials.values(), key=lambda t: t.id, default=None)
    if first is None:
        raise ConflictError(f"experiment {record.id} has no trial to continue")
    text = yaml.safe_dump(raw, sort_keys=False)
    length = searcher_in_batches(config).max_length.value
    return experiment, [
        fx.SetExperiment(record.id, {"config": raw, "config_text": text}),
        *experiment_life.continue_trial(experiment, first, length),
    ]
