"""`init()` and `Trainer`: Determined's Trainer API over the Trial controller.

On a cluster (`ASSAY_TRIAL_SPEC` set by the agent) the context comes from the master's
trial spec and `fit` trains under the master's session, exactly as a `module:Class`
entrypoint does. Under `assay trial run-local` (`ASSAY_LOCAL_SPEC`) the config's
`searcher.max_length` decides how long, as it would on a cluster. Run with plain `python`,
`fit` trains to its `max_length` under a local session and writes checkpoints under
`./checkpoints`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import shutil
import sys
import tempfile
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from assay._checkpoint import verify_checkpoint
from assay._context import TrialContext
from assay._distributed import DistributedContext
from assay._precision import make_precision
from assay._ranks import leave_groups
from assay._session import CheckpointReport, LocalSession, MetricsReport, Session
from assay._trial import Trial, construct_trial
from assay._worker import build_context, local_result, preempt_watcher, train_slot
from assay.common.archive import make_local_output_dir
from assay.common.spec import ClusterSpec, LocalResult, LocalSpec, spec_from_env
from assay.common.storage import StorageManager
from assay.config import ExperimentConfig, Length, parse_config, sample_hparams
from assay.errors import AssayError, TrialLoadError, TrialPreempted

log = logging.getLogger("assay")
CHECKPOINTS = Path("checkpoints")


class TrainUnit:
    """A length for `Trainer.fit`: `Batch(n)` or `Epoch(n)`."""

    def __init__(self, value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{type(self).__name__} takes a positive integer, got {value!r}")
        self.value = value

    def to_length(self) -> Length:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.value})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, TrainUnit) and type(other) is type(self) and other.value == self.value
        )

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.value))


class Batch(TrainUnit):
    """`n` global batches (one dataloader batch on every slot)."""

    def to_length(self) -> Length:
        return Length.batches(self.value)


class Epoch(TrainUnit):
    """`n` epochs of the training data loader (or of `records_per_epoch` records)."""

    def to_length(self) -> Length:
        return Length.epochs(self.value)


@dataclass
class _Origin:
    """How `init()` built a context: what `Trainer.fit` needs to train it."""

    cluster: ClusterSpec | None
    metric_required: bool
    hparams: dict[str, Any]
    local: LocalSpec | None = None  # under `assay trial run-local`
    # The config gives `searcher.max_length` (a script's config may leave it out).
    config_length: bool = False


_ORIGINS: weakref.WeakKeyDictionary[TrialContext, _Origin] = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def init(
    *,
    hparams: Mapping[str, Any] | None = None,
    exp_conf: Mapping[str, Any] | None = None,
    distributed: DistributedContext | None = None,
    aggregation_frequency: int = 1,
    enable_tensorboard_logging: bool = True,
) -> Iterator[TrialContext]:
    """Build the `PyTorchTrialContext` for `Trainer` (Determined's `pytorch.init`).

    On a cluster, the config, hyperparameters, seed and ids come from the trial spec that
    `ASSAY_TRIAL_SPEC` names (`hparams`/`exp_conf` are then ignored). Off-cluster they come
    from `exp_conf` (an experiment config mapping; its `searcher.metric` is then required
    in validations) and `hparams` (constant values; without them the config's
    hyperparameters are sampled with its `experiment_seed`), or a minimal config.
    torch.distributed is initialised when WORLD_SIZE > 1 (or from `distributed`), and torn
    down on exit if this call started it. `enable_tensorboard_logging` is accepted for
    compatibility: event files written through `get_tensorboard_writer()` are always kept
    (in the checkpoint storage's `tensorboard/trial-<id>`).
    """
    del enable_tensorboard_logging
    started_group = not torch.distributed.is_initialized()
    spec = spec_from_env()
    if isinstance(spec, LocalSpec):
        world = distributed or DistributedContext.from_env()
        raw = dict(spec.config)
        raw["resources"] = {**dict(raw.get("resources") or {}), "slots_per_trial": world.size}
        config = parse_config(raw)
        bounded = config.searcher.max_length.bounded
        origin = _Origin(None, True, dict(spec.hparams), local=spec, config_length=bounded)
        context = build_context(
            config,
            env=None,
            hparams=spec.hparams,
            trial_seed=spec.trial_seed,
            distributed=world,
        )
    elif spec is not None:
        if hparams is not None or exp_conf is not None:
            log.info("on a cluster: hparams and exp_conf come from the master, not init()")
        config = parse_config(spec.config)
        bounded = config.searcher.max_length.bounded
        origin = _Origin(spec, True, dict(spec.hparams), config_length=bounded)
        context = build_context(
            config,
            env=None,
            hparams=spec.hparams,
            trial_seed=spec.trial_seed,
            trial_id=spec.trial_id,
            experiment_id=spec.experiment_id,
            distributed=distributed,
        )
    else:
        world = distributed or DistributedContext.from_env()
        raw = _local_config(hparams, exp_conf, world.size, aggregation_frequency)
        config = parse_config(raw)
        if hparams is None:
            values = sample_hparams(config.hyperparameters, random.Random(config.experiment_seed))
        else:
            values = dict(hparams)
        metric_required = exp_conf is not None and "searcher" in exp_conf
        given = metric_required and "max_length" in dict((exp_conf or {})["searcher"] or {})
        origin = _Origin(None, metric_required, values, config_length=given)
        context = build_context(
            config,
            env=None,
            hparams=values,
            trial_seed=config.experiment_seed,
            distributed=world,
        )
    _ORIGINS[context] = origin
    try:
        yield context
    finally:
        context._close()
        if started_group and torch.distributed.is_initialized():
            torch.distributed.barrier()
            leave_groups()


def _local_config(
    hparams: Mapping[str, Any] | None,
    exp_conf: Mapping[str, Any] | None,
    slots: int,
    aggregation_frequency: int,
) -> dict[str, Any]:
    """`exp_conf` completed (or a minimal config) for a run off-cluster on `slots` slots."""
    raw: dict[str, Any] = dict(exp_conf or {})
    raw.setdefault("name", "trainer")
    if hparams is not None:
        raw["hyperparameters"] = {k: {"type": "const", "val": v} for k, v in hparams.items()}
    raw.setdefault("hyperparameters", {})
    if "entrypoint" not in raw:
        has_batch_size = "global_batch_size" in raw["hyperparameters"]
        script = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "train.py"
        raw["entrypoint"] = "__main__:Trial" if has_batch_size else f"python3 {script}"
    searcher = dict(raw.get("searcher") or {})
    searcher.setdefault("name", "single")
    searcher.setdefault("metric", "validation_loss")
    searcher.setdefault("max_length", {"batches": 1})  # Trainer.fit(max_length=...) decides
    raw["searcher"] = searcher
    resources = dict(raw.get("resources") or {})
    resources["slots_per_trial"] = slots
    raw["resources"] = resources
    optimizations = dict(raw.get("optimizations") or {})
    optimizations.setdefault("aggregation_frequency", aggregation_frequency)
    raw["optimizations"] = optimizations
    return raw


CheckpointPolicy = Literal["best", "all", "none"]


class Trainer:
    """Trains a `PyTorchTrial` built from a context that `pytorch.init()` yielded."""

    def __init__(self, trial: Trial, context: TrialContext | None = None) -> None:
        context = context if context is not None else getattr(trial, "context", None)
        if not isinstance(context, TrialContext) or context not in _ORIGINS:
            raise AssayError(
                "Trainer(trial, context) needs the context that `with pytorch.init() as "
                "context:` yielded"
            )
        self.trial = trial
        self.context = context

    def fit(
        self,
        *,
        max_length: TrainUnit | None = None,
        validation_period: TrainUnit | None = None,
        checkpoint_period: TrainUnit | None = None,
        reporting_period: TrainUnit | None = None,
        checkpoint_policy: CheckpointPolicy = "best",
        latest_checkpoint: str | Path | None = None,
        step_zero_validation: bool = False,
        test_mode: bool = False,
        profiling_enabled: bool = False,
    ) -> LocalResult | None:
        """Train, validate and checkpoint; rank 0 returns a `LocalResult`, others None.

        `max_length`: how long to train (`Batch(n)`/`Epoch(n)`; without it, the
        `exp_conf`'s `searcher.max_length`). On a cluster, and under `assay trial
        run-local` when the config gives `searcher.max_length`, the searcher's length
        decides instead and rank 0 logs that this one is ignored.
        `validation_period` / `checkpoint_period`: validate / checkpoint every so many
        batches or epochs (replace `min_validation_period` / `min_checkpoint_period`).
        `reporting_period`: training metrics every so many batches (`scheduling_unit`).
        `checkpoint_policy`: `best` (also checkpoint after a validation that improves the
        searcher metric), `all` (after every validation) or `none` (only the checkpoints
        the end of training and preemption need).
        `latest_checkpoint`: a checkpoint directory, or a uuid under ./checkpoints, to
        continue from (on a cluster the master's restore point wins).
        `step_zero_validation`: validate before the first batch. `test_mode`: train one
        batch and validate (a smoke test). `profiling_enabled` is accepted and ignored.
        """
        del profiling_enabled
        context = self.context
        origin = _ORIGINS[context]
        if test_mode:
            max_length = Batch(1)
        elif max_length is not None and _searcher_decides(origin):
            _check_unit("max_length", max_length)
            if context.distributed.is_chief:
                log.warning("%s", _ignored_length(origin, context._config, max_length))
            max_length = None
        config = _fit_config(
            context._config,
            max_length=max_length,
            validation_period=validation_period,
            checkpoint_period=checkpoint_period,
            reporting_period=reporting_period,
            checkpoint_policy=checkpoint_policy,
            step_zero_validation=step_zero_validation,
        )
        context._config = config
        if origin.cluster is not None:
            unbounded = max_length is not None and not origin.config_length
            cap = config.searcher.trial_length if unbounded else None
            return self._fit_on_cluster(origin.cluster, latest_checkpoint, cap)
        if max_length is None and origin.local is None and not origin.config_length:
            raise AssayError(
                "Trainer.fit off-cluster needs max_length (pytorch.Epoch or Batch), or "
                "searcher.max_length in the experiment config"
            )
        local = origin.local
        session: LocalSession | None = None
        if context.distributed.is_chief:
            session = LocalSession(max_batches=0) if local is None else _RecordingSession(local)
        checkpoints = CHECKPOINTS.resolve() if local is None else Path(local.checkpoint_dir)
        resume = _resolve_checkpoint(latest_checkpoint, checkpoints)
        if resume is None and local is not None and local.latest_checkpoint is not None:
            resume = Path(local.restore_dir or checkpoints) / local.latest_checkpoint
        if local is None and context.distributed.is_chief:
            # a plain run's ./checkpoints, kept out of the model directory's archive
            # (run-local marks its own); one that exists already is left as it is
            with contextlib.suppress(OSError):  # the first checkpoint says what is wrong
                make_local_output_dir(checkpoints)
        result = train_slot(
            self.trial,
            context,
            session,
            checkpoints,
            resume_from=resume,
            max_length=config.searcher.trial_length,
            metric_required=origin.metric_required,
        )
        return None if session is None else local_result(result, session, origin.hparams)

    def _fit_on_cluster(
        self, spec: ClusterSpec, latest_checkpoint: str | Path | None, cap: Length | None
    ) -> LocalResult | None:
        """Train under the master's session; `cap`: fit's `max_length` when the config
        gives the searcher none."""
        context = self.context
        chief = context.distributed.is_chief
        with _cluster_session(spec, chief) as (master, ckpts, resume, storage):
            session = master if cap is None or master is None else _FitLength(master, cap, context)
            preempt = preempt_watcher(session, None)
            try:
                result = train_slot(
                    self.trial,
                    context,
                    session,
                    ckpts,
                    resume_from=resume or latest_checkpoint,
                    preempt=preempt,
                    storage=storage,
                )
            except TrialPreempted as e:
                from assay._worker import leave_process_group
                from assay.errors import PREEMPTED_EXIT_CODE

                print(e, flush=True)
                leave_process_group(PREEMPTED_EXIT_CODE)
                sys.exit(PREEMPTED_EXIT_CODE)
        return None if session is None else local_result(result, session, spec.hparams)


def _fit_config(
    config: ExperimentConfig,
    *,
    max_length: TrainUnit | None,
    validation_period: TrainUnit | None,
    checkpoint_period: TrainUnit | None,
    reporting_period: TrainUnit | None,
    checkpoint_policy: CheckpointPolicy,
    step_zero_validation: bool,
) -> ExperimentConfig:
    """The context's config with `fit`'s arguments in place of the matching keys."""
    for name, value in (
        ("max_length", max_length),
        ("validation_period", validation_period),
        ("checkpoint_period", checkpoint_period),
        ("reporting_period", reporting_period),
    ):
        _check_unit(name, value)
    if checkpoint_policy not in ("best", "all", "none"):
        raise AssayError(
            f"fit(checkpoint_policy=...) is one of best, all, none; got {checkpoint_policy!r}"
        )
    changes: dict[str, Any] = {"checkpoint_policy": checkpoint_policy}
    if step_zero_validation:
        changes["perform_initial_validation"] = True
    if validation_period is not None:
        changes["min_validation_period"] = validation_period.to_length()
    if checkpoint_period is not None:
        changes["min_checkpoint_period"] = checkpoint_period.to_length()
    if reporting_period is not None:
        if not isinstance(reporting_period, Batch):
            raise AssayError("fit(reporting_period=...) takes pytorch.Batch(n)")
        changes["scheduling_unit"] = reporting_period.value
    if max_length is not None:
        changes["searcher"] = dataclasses.replace(
            config.searcher, max_length=max_length.to_length()
        )
    return dataclasses.replace(config, **changes)


def _check_unit(name: str, value: object) -> None:
    if value is not None and not isinstance(value, TrainUnit):
        raise AssayError(
            f"fit({name}=...) takes pytorch.Batch(n) or pytorch.Epoch(n), got {value!r}"
        )


def _searcher_decides(origin: _Origin) -> bool:
    """Whether the searcher's length, not `fit(max_length=...)`, says how long to train:
    when the config gives `searcher.max_length`, on a cluster and under `assay trial
    run-local` (which trains as a cluster would). Without one, fit's length (or the trial
    stopping itself) ends the trial; a plain `python3 train.py` always trains fit's."""
    return (origin.cluster is not None or origin.local is not None) and origin.config_length


def _ignored_length(origin: _Origin, config: ExperimentConfig, max_length: TrainUnit) -> str:
    """The one log line that says fit's `max_length` gives way to the searcher's."""
    if origin.cluster is not None:
        return (
            f"fit(max_length={max_length!r}) is ignored on a cluster: the searcher "
            "decides how long this trial trains"
        )
    return (
        f"fit(max_length={max_length!r}) is ignored: run-local trains as a cluster "
        f"would, to searcher.max_length ({config.searcher.trial_length.in_words()})"
    )


class _FitLength:
    """Rank 0's session on a cluster whose config gives the searcher no `max_length` (a
    script's search that leaves the length to it): the master's targets are unbounded,
    so fit's `max_length` ends the trial there, as a trial asking to stop (completed)."""

    def __init__(self, session: Session, length: Length, context: TrialContext) -> None:
        self.session = session
        self.length = length
        self.context = context  # its training loader's length counts epochs

    def _end(self) -> int:
        return self.length.to_batches(self.context._batches_per_epoch)

    def next_target(self, total_batches: int) -> int | None:
        end = self._end()
        if total_batches >= end:
            return None
        target = self.session.next_target(total_batches)
        return None if target is None else min(target, end)

    def complete_target(
        self, total_batches: int, searcher_metric: float, *, stop_requested: bool = False
    ) -> None:
        stop_requested = stop_requested or total_batches >= self._end()
        self.session.complete_target(total_batches, searcher_metric, stop_requested=stop_requested)

    def report_training_metrics(self, report: MetricsReport) -> None:
        self.session.report_training_metrics(report)

    def report_validation_metrics(self, report: MetricsReport) -> None:
        self.session.report_validation_metrics(report)

    def report_metrics(self, group: str, report: MetricsReport) -> None:
        self.session.report_metrics(group, report)

    def report_checkpoint(self, report: CheckpointReport) -> None:
        self.session.report_checkpoint(report)

    def preempt_requested(self) -> bool:
        return self.session.preempt_requested()


class _RecordingSession(LocalSession):
    """A `LocalSession` that also writes its reports where `assay trial run-local` reads
    them (the records of `assay.core`'s local twin)."""

    def __init__(self, spec: LocalSpec) -> None:
        from assay._backend import LocalBackend

        super().__init__(max_batches=0, echo=False)
        self._backend = LocalBackend(Path(spec.metrics_path), None)

    def report_training_metrics(self, report: MetricsReport) -> None:
        super().report_training_metrics(report)
        self._backend.report_metrics("training", report.total_batches, report.metrics)

    def report_validation_metrics(self, report: MetricsReport) -> None:
        super().report_validation_metrics(report)
        self._backend.report_metrics("validation", report.total_batches, report.metrics)

    def report_metrics(self, group: str, report: MetricsReport) -> None:
        super().report_metrics(group, report)
        self._backend.report_metrics(group, report.total_batches, report.metrics)

    def report_checkpoint(self, report: CheckpointReport) -> None:
        super().report_checkpoint(report)
        self._backend.report_checkpoint(report.metadata, str(report.path))


def _resolve_checkpoint(latest: str | Path | None, checkpoints: Path) -> Path | None:
    """A checkpoint directory, or the uuid of one under `checkpoints`."""
    if latest is None:
        return None
    path = Path(latest)
    if path.is_dir():
        return path.resolve()
    if (checkpoints / str(latest)).is_dir():
        return checkpoints / str(latest)
    raise AssayError(
        f"latest_checkpoint {str(latest)!r} is neither a checkpoint directory nor the uuid of "
        f"one under {checkpoints}"
    )


@contextlib.contextmanager
def _cluster_session(
    spec: ClusterSpec, chief: bool
) -> Iterator[tuple[Session | None, Path, Path | None, StorageManager | None]]:
    """Rank 0's `ClusterSession` (None on other ranks), where checkpoints are written, the
    checkpoint to restore, and the object storage every rank uploads its shards to (None
    on shared_fs): as `assay._cluster.run_cluster_slot` sets them up."""
    from assay._cluster import ClusterSession, fetch_checkpoint
    from assay._trial_client import TrialClient, retry_budget_from_env
    from assay.common.storage import is_remote, storage_for

    storage_config = parse_config(spec.config).checkpoint_storage
    scratch = Path(tempfile.mkdtemp(prefix="assay-checkpoints-"))
    session: ClusterSession | None = None
    try:
        storage: StorageManager | None = None
        checkpoints = Path(spec.checkpoint_root)
        if storage_config.type != "shared_fs":
            storage = storage_for(storage_config)
            checkpoints = scratch / "out"
        resume: Path | None = Path(spec.restore_from) if spec.restore_from else None
        if spec.restore_from and is_remote(spec.restore_from):
            resume = fetch_checkpoint(spec.restore_from, storage_config, scratch)
        if chief:
            client = TrialClient(spec.trial_api, spec.token, retry_s=retry_budget_from_env(None))
            local_root = checkpoints if storage is not None else None
            session = ClusterSession(client, spec, storage, local_root)
        yield session, checkpoints, resume, storage
    finally:
        if session is not None:
            session.close()
        shutil.rmtree(scratch, ignore_errors=True)


def load_trial_from_checkpoint_path(
    path: str | Path,
    trial_class: type[Trial] | None = None,
    trial_kwargs: Mapping[str, Any] | None = None,
    torch_load_kwargs: Mapping[str, Any] | None = None,
) -> Trial:
    """Build `trial_class` from a checkpoint directory and load its models' weights.

    This is how to use a trained Trial outside training (inference, export): the Trial
    is constructed on the CPU on one slot with the hyperparameters stored in the
    checkpoint (`trial_class(context, **trial_kwargs)` when `trial_kwargs` is given),
    then every model it wrapped gets the checkpoint's weights; the models are in eval
    mode. Assay checkpoints hold weights, not code, so `trial_class` is required.
    `torch_load_kwargs` is accepted for compatibility (weights are always loaded with
    `weights_only=True`).
    """
    del torch_load_kwargs
    path = Path(path)
    metadata = verify_checkpoint(path)
    if trial_class is None:
        raise TrialLoadError(
            "Assay checkpoints hold weights, not code: pass "
            "trial_class=YourTrial to load_trial_from_checkpoint_path"
        )
    hparams = dict(metadata.hparams)
    config = parse_config(_local_config(hparams, None, 1, 1))
    device = torch.device("cpu")
    context = TrialContext(
        config=config,
        hparams=hparams,
        distributed=DistributedContext(),
        device=device,
        precision=make_precision("off", device),
        trial_id=metadata.trial_id,
    )
    if trial_kwargs is not None:
        trial = trial_class(context, **trial_kwargs)
    else:
        trial = construct_trial(trial_class, context)
    from assay._checkpoint_models import (
        load_models,  # models.pt, or gathered from a sharded checkpoint
    )

    models = load_models(path)
    if len(models) != len(context.models):
        raise TrialLoadError(
            f"checkpoint {path} holds {len(models)} models but {trial_class.__qualname__} "
            f"wrapped {len(context.models)}"
        )
    for model, state in zip(context._unwrapped_models(), models, strict=True):
        model.load_state_dict(state)
        model.eval()
    return trial
