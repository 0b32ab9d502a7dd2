"""The training loop every slot runs: batches, validation, checkpoints, reports.

Lengths and periods count global batches (one dataloader batch on every rank), as in
Determined. Only rank 0 talks to the session; its answers are broadcast, so every rank
takes the same decisions at the same batch.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from assay._checkpoint import (
    CheckpointError,
    CheckpointMetadata,
    FileEntry,
    capture_rng_state,
    load_file,
    load_user_state,
    new_uuid,
    restore_rng_state,
    staging_dir,
    verify_checkpoint,
    write_checkpoint,
)
from assay._context import TrialContext
from assay._data import ShardedLoader
from assay._preempt import PreemptWatcher
from assay._rank_metrics import GROUP as RANK_GROUP
from assay._rank_metrics import RankMeter, rank_metrics
from assay._session import CheckpointReport, MetricsReport, Session
from assay._trial import (
    BuiltinReducer,
    MetricReducer,
    PyTorchCallback,
    Reducer,
    Trial,
    _check_arity,
    check_callbacks,
    evaluation_mode,
)
from assay.common.storage import StorageManager, tensorboard_name
from assay.errors import (
    SearcherMetricError,
    TrainingError,
    TrialContractError,
    TrialPreempted,
)

log = logging.getLogger("assay")
# Distributed ranks agree on stopping every this many batches (one small CPU collective).
PREEMPT_VOTE_BATCHES = 8


def _warn_records_per_epoch(records: int, global_batch: int, batches: int | None) -> None:
    """Say so when `records_per_epoch` disagrees with the training data: the master
    converts lengths in epochs with it, while the harness's epochs are the loader's."""
    if batches is None:
        return
    by_config = -(-records // global_batch)
    if abs(by_config - batches) > 1:  # 1: a loader that drops its last, short batch
        log.warning(
            "records_per_epoch (%d) makes an epoch %d batches of %d, but the training data "
            "loader gives %d: on a cluster a searcher length in epochs counts %d batches an "
            "epoch, periods and run-local %d; set records_per_epoch to the training set's "
            "size",
            records,
            by_config,
            global_batch,
            batches,
            by_config,
            batches,
        )


@dataclass
class TrainState:
    """Counters that a checkpoint carries, so a restored trial continues exactly."""

    total_batches: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    last_validation: int = 0
    last_checkpoint: int = 0
    validation_metrics: dict[str, float] = field(default_factory=dict)
    # The best searcher metric so far (checkpoint_policy: best).
    best_metric: float | None = None


@dataclass(frozen=True)
class RunResult:
    total_batches: int
    validation_metrics: dict[str, float]
    checkpoint: Path | None


class TrialController:
    """Runs one Trial on this slot until the session has no more targets."""

    def __init__(
        self,
        trial: Trial,
        context: TrialContext,
        session: Session | None,
        checkpoint_root: Path,
        *,
        seed: int,
        preempt: PreemptWatcher | None = None,
        metric_required: bool = True,
        storage: StorageManager | None = None,
    ) -> None:
        """`metric_required=False` (the Trainer off-cluster without a searcher config):
        validations need not return `searcher.metric`; `checkpoint_policy: best` then
        checkpoints only when the metric is there and improves. `storage`: where every
        rank uploads its own files of a sharded checkpoint (object storage; `checkpoint_root`
        is then each process's local directory); None: `checkpoint_root` is one directory
        that every rank writes into (shared_fs, or one machine)."""
        self.trial = trial
        self.preempt = preempt
        self.metric_required = metric_required
        self._batches_since_vote = 0
        self._preempt_pending = False
        self._just_validated = False
        self.evaluation = evaluation_mode(type(trial))
        self.callbacks: dict[str, PyTorchCallback] = check_callbacks(trial.build_callbacks())
        self._restored_uuid: str | None = None
        self.context = context
        self.dist = context.distributed
        if self.dist.is_chief and session is None:
            raise ValueError("rank 0 needs a session")
        self.session = session
        self.config = context._config
        self.checkpoint_root = checkpoint_root
        self.storage = storage
        rank, size = self.dist.rank, self.dist.size
        self.train_data = ShardedLoader(
            trial.build_training_data_loader(), rank=rank, size=size, seed=seed, training=True
        )
        self.val_loader = trial.build_validation_data_loader()
        self.val_data = ShardedLoader(
            self.val_loader, rank=rank, size=size, seed=seed, training=False
        )
        self.batches_per_epoch = self.train_data.batches_per_epoch()
        records = self.config.records_per_epoch
        if self.batches_per_epoch is None and records and context._global_batch_size:
            self.batches_per_epoch = max(1, records // context._global_batch_size)
        elif records and context._global_batch_size and self.dist.is_chief:
            _warn_records_per_epoch(records, context._global_batch_size, self.batches_per_epoch)
        context._batches_per_epoch = self.batches_per_epoch
        tensorboard = checkpoint_root / tensorboard_name(context.get_trial_id())
        context._tensorboard_path = tensorboard if rank == 0 else tensorboard / f"rank-{rank}"
        if self.batches_per_epoch == 0:
            raise TrainingError(
                "the training data loader has no batches; check its dataset size against "
                "the per-slot batch size and drop_last"
            )
        self.val_period = _period(self.config.min_validation_period, self.batches_per_epoch)
        self.ckpt_period = _period(self.config.min_checkpoint_period, self.batches_per_epoch)
        self.state = TrainState()
        self.reducers = _reducers(trial.evaluation_reducer())
        self.last_validation: dict[str, float] = {}
        self.last_checkpoint: Path | None = None  # rank 0 only: the others write none
        self._checkpointed = False  # the same on every rank, unlike last_checkpoint
        # Training metric values since the last report, in batch order: tensors stay on
        # their device until the report; floats are numbers or values from a checkpoint.
        self._window: dict[str, list[torch.Tensor | float]] = {}
        self._rank_meter = RankMeter(context.device)

    # --- the loop -----------------------------------------------------------------------

    def run(self) -> RunResult:
        """Train until the session has no more targets (or a stop is requested)."""
        try:
            self._call("on_trial_startup", self.state.total_batches, self._restored_uuid)
            self._call("on_training_start")
            return self._run()
        finally:
            self.context._close()
            self._call("on_trial_shutdown")

    def _run(self) -> RunResult:
        batches: Iterator[Any] | None = None
        if self.config.perform_initial_validation and not self.last_validation:
            self._validate_and_apply_policy()
        while True:
            if self.dist.any(self.context._stop_requested):
                return self._finish_on_request()
            ask = self.session.next_target(self.state.total_batches) if self.session else None
            target = self.dist.broadcast(ask)
            if target is None:
                break
            self._check_target(target)
            while self.state.total_batches < target:
                if batches is None:
                    if self.state.batch_in_epoch == 0:
                        self._call("on_training_epoch_start", self.state.epoch)
                    batches = self.train_data.epoch(self.state.epoch, self.state.batch_in_epoch)
                try:
                    batch = next(batches)
                except StopIteration:
                    if self.state.batch_in_epoch == 0:
                        raise TrainingError(
                            "the training data loader yielded no batches for this slot; "
                            "check its dataset size against the per-slot batch size"
                        ) from None
                    self._end_epoch()
                    batches = None
                    continue
                self._train_batch(batch)
                if self.state.batch_in_epoch == self.batches_per_epoch:
                    self._end_epoch()
                    batches = None
                self._after_batch()
                stop = self._should_stop()
                if stop == "preempt" or self._preempt_pending:
                    if not self._gradients_stranded():
                        return self._stop_for_preemption()
                    self._preempt_pending = True  # stop at the accumulation's boundary
                if stop == "user":
                    return self._finish_on_request()
            self._complete_target()
        return self._result()

    def _complete_target(self, *, stop_requested: bool = False) -> None:
        """At a target: report, validate and checkpoint this batch, tell the session."""
        self._flush_training_metrics()
        if self.state.last_validation != self.state.total_batches or not self.last_validation:
            self._validate_and_apply_policy()
        if self.state.last_checkpoint != self.state.total_batches or not self._checkpointed:
            self._checkpoint()
        if self.session is not None:
            metric = self.last_validation.get(self.config.searcher.metric, float("nan"))
            self.session.complete_target(
                self.state.total_batches, metric, stop_requested=stop_requested
            )

    def _finish_on_request(self) -> RunResult:
        """`context.set_stop_requested(True)`: end here as if this batch were the target."""
        log.info("batch %d: the trial asked to stop", self.state.total_batches)
        self._complete_target(stop_requested=True)
        return self._result()

    def _result(self) -> RunResult:
        return RunResult(self.state.total_batches, dict(self.last_validation), self.last_checkpoint)

    def _call(self, hook: str, *args: Any) -> None:
        for callback in self.callbacks.values():
            getattr(callback, hook)(*args)

    # --- preemption ---------------------------------------------------------------------

    def _should_stop(self) -> str | None:
        """ "preempt", "user" (set_stop_requested) or None; every rank answers the same at
        the same batch."""
        preempt = self.preempt is not None and self.preempt.requested
        user = self.context._stop_requested
        if not self.dist.is_distributed:
            return "preempt" if preempt else "user" if user else None
        # A vote is a collective: hold one every few batches, not after each (and right
        # after a validation, whose callbacks often ask to stop).
        self._batches_since_vote += 1
        due = self._batches_since_vote >= PREEMPT_VOTE_BATCHES
        just_validated, self._just_validated = self._just_validated, False
        if due:
            self._batches_since_vote = 0
            if self.preempt is not None and self.dist.any(preempt):
                return "preempt"
        if (due or just_validated) and self.dist.any(user):
            return "user"
        return None

    def _gradients_stranded(self) -> bool:
        """Whether a checkpoint now would lose gradients: mid-accumulation under a
        strategy that cannot save them (FSDP holds them inside its units)."""
        aggregation = self.config.optimizations.aggregation_frequency
        mid = self.state.total_batches % aggregation != 0
        return mid and not self.context._strategy.saves_partial_gradients

    def _check_target(self, target: int) -> None:
        """Refuse, before training towards it, a target that ends in the middle of a
        gradient accumulation under a strategy that cannot checkpoint one (FSDP)."""
        aggregation = self.config.optimizations.aggregation_frequency
        if target % aggregation == 0 or self.context._strategy.saves_partial_gradients:
            return
        raise TrialContractError(
            f"the searcher asks to train to batch {target}, which ends in the middle of a "
            f"gradient accumulation (optimizations.aggregation_frequency: {aggregation}); "
            f"under strategy {self.context._strategy.name} a checkpoint cannot be taken "
            "there: make searcher.max_length (and the searcher's other lengths, in batches) "
            f"multiples of {aggregation}"
        )

    def _stop_for_preemption(self) -> RunResult:
        self._flush_training_metrics()
        if self.state.last_checkpoint != self.state.total_batches or not self._checkpointed:
            self._checkpoint()
        raise TrialPreempted(
            f"stopped at batch {self.state.total_batches} to be resumed later from its checkpoint"
        )

    def _train_batch(self, batch: Any) -> None:
        state, context = self.state, self.context
        batch = context.to_device(batch)
        begin = context._begin_batch(state.epoch, state.total_batches, state.batch_in_epoch)
        with begin, context._precision.autocast():
            out = self.trial.train_batch(batch, state.epoch, state.total_batches)
        context._end_batch()
        state.total_batches += 1
        state.batch_in_epoch += 1
        self._rank_meter.batch_done()
        self._accumulate(out)

    def _end_epoch(self) -> None:
        self.context._end_epoch()
        self._call("on_training_epoch_end", self.state.epoch)
        self.state.epoch += 1
        self.state.batch_in_epoch = 0

    def _after_batch(self) -> None:
        state = self.state
        if state.total_batches % self.config.scheduling_unit == 0:
            self._flush_training_metrics()
        if self.val_period and state.total_batches - state.last_validation >= self.val_period:
            self._validate_and_apply_policy()
        on_boundary = state.total_batches % self.config.optimizations.aggregation_frequency == 0
        due = self.ckpt_period and state.total_batches - state.last_checkpoint >= self.ckpt_period
        if due and on_boundary:
            self._checkpoint()

    # --- training metrics ---------------------------------------------------------------

    def _accumulate(self, out: Mapping[str, Any] | torch.Tensor) -> None:
        if isinstance(out, torch.Tensor):
            out = {"loss": out}
        elif not isinstance(out, Mapping):
            raise TrainingError(
                f"train_batch must return a dict of metrics or a loss tensor, got "
                f"{type(out).__name__}"
            )
        window = self._window
        for name, value in out.items():
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    raise TrainingError(
                        f"train_batch returned metric {name!r} as a tensor of shape "
                        f"{tuple(value.shape)}; return scalars"
                    )
                value = value.detach()  # no copy, no device sync: reduced at the report
            elif isinstance(value, int | float) and not isinstance(value, bool):
                value = float(value)
            else:
                raise TrainingError(
                    f"train_batch returned metric {name!r} as {type(value).__name__}; "
                    "return numbers or scalar tensors"
                )
            values = window.get(name)
            if values is None:
                window[name] = [value]
            else:
                values.append(value)

    def _window_values(self) -> dict[str, list[float]]:
        """This rank's pending training metric values as floats (one sync per device)."""
        return {name: _floats(values) for name, values in self._window.items()}

    def _flush_training_metrics(self) -> None:
        # Summed left to right in float64, so a window carried through a checkpoint adds
        # up to exactly what it would have without the restore.
        local: dict[str, tuple[float, int]] = {}
        window = self._window_values()
        for name, values in window.items():
            total = 0.0
            for value in values:
                total += value
            local[name] = (total, len(values))
        self._window.clear()
        everyone = self.dist.allgather(local)
        totals: dict[str, list[float]] = {}
        for per_rank in everyone:
            for name, (total, count) in per_rank.items():
                acc = totals.setdefault(name, [0.0, 0.0])
                acc[0] += total
                acc[1] += count
        if not totals:
            return
        metrics = {name: acc[0] / acc[1] for name, acc in totals.items()}
        metrics.update(self._wrapped_metrics(training=True))
        system = rank_metrics(self.dist.allgather(self._rank_meter.sample()))
        if self.session is not None:
            self.session.report_training_metrics(
                MetricsReport(self.state.total_batches, self.state.epoch, metrics)
            )
            self.session.report_metrics(
                RANK_GROUP, MetricsReport(self.state.total_batches, self.state.epoch, system)
            )
        if self.callbacks:
            longest = max(len(values) for values in window.values())
            per_batch = [
                {name: values[i] for name, values in window.items() if i < len(values)}
                for i in range(longest)
            ]
            self._call("on_training_workload_end", dict(metrics), per_batch)

    def _wrapped_metrics(self, *, training: bool) -> dict[str, float]:
        """The metrics of `context.wrap_reducer` reducers (a collective when there are any);
        the reducers are reset."""
        wrapped = [
            w for w in self.context._reducers if (w.for_training if training else w.for_validation)
        ]
        if not wrapped:
            return {}
        everyone = self.dist.allgather([w.reducer.per_slot_reduce() for w in wrapped])
        metrics: dict[str, float] = {}
        for i, w in enumerate(wrapped):
            value = w.reducer.cross_slot_reduce([per_rank[i] for per_rank in everyone])
            w.reducer.reset()
            if w.name is None:
                if not isinstance(value, Mapping):
                    raise TrainingError(
                        "a reducer wrapped with name=None must return a dict of metrics, got "
                        f"{type(value).__name__}"
                    )
                metrics.update({k: _number(k, v) for k, v in value.items()})
            else:
                metrics[w.name] = _number(w.name, value)
        return metrics

    # --- validation ---------------------------------------------------------------------

    def _validate_and_apply_policy(self) -> None:
        """Validate; then checkpoint as `checkpoint_policy` says (`all`: always; `best`:
        when the searcher metric improved; `none`: never here)."""
        improved = self._validate()
        policy = self.config.checkpoint_policy
        wanted = policy == "all" or (policy == "best" and improved)
        fresh = self.state.last_checkpoint != self.state.total_batches or not self._checkpointed
        if wanted and fresh:
            self._checkpoint()

    def _validate(self) -> bool:
        """Validate and report; return whether the searcher metric improved on its best."""
        context = self.context
        self._call("on_validation_start")
        for wrapped in context._reducers:
            if wrapped.for_validation:
                wrapped.reducer.reset()
        was_training = [m.training for m in context.models]
        for model in context.models:
            model.eval()
            if hasattr(model, "require_forward_param_sync"):
                # Shards may be uneven: no rank may wait on a buffer broadcast in eval.
                setattr(model, "require_forward_param_sync", False)  # noqa: B010
        reducers: dict[str, MetricReducer] = {}
        full: dict[str, float] | None = None
        try:
            with torch.no_grad():
                if self.evaluation == "full":
                    full = self._evaluate_full_dataset()
                for batch_idx, (batch, counts) in enumerate(
                    self._lockstep(self.val_data.epoch(0) if self.evaluation != "full" else ())
                ):
                    batch = context.to_device(batch)
                    with context._precision.autocast():
                        evaluate = cast(Any, self.trial).evaluate_batch
                        if self.evaluation == "batch_idx":
                            out = evaluate(batch, batch_idx)
                        else:
                            out = evaluate(batch)
                    if not counts:
                        continue
                    if not isinstance(out, Mapping):
                        raise TrainingError(
                            "evaluate_batch must return a dict of metrics, got "
                            f"{type(out).__name__}"
                        )
                    for name, value in out.items():
                        reducer = reducers.get(name)
                        if reducer is None:
                            reducer = reducers[name] = self.reducers(name)
                            reducer.reset()
                        try:
                            reducer.update(value)
                        except ValueError as e:
                            raise TrainingError(
                                f"evaluate_batch returned metric {name!r}: {e}"
                            ) from None
        finally:
            for model, mode in zip(context.models, was_training, strict=True):
                model.train(mode)
        metrics: dict[str, float] = {}
        if full is not None:
            metrics.update(full)
        else:
            per_slot = {name: r.per_slot_reduce() for name, r in reducers.items()}
            everyone = self.dist.allgather(per_slot)
            for name in sorted({name for per_rank in everyone for name in per_rank}):
                reducer = reducers.get(name) or self.reducers(name)
                value = reducer.cross_slot_reduce([r[name] for r in everyone if name in r])
                metrics[name] = float(value.item() if isinstance(value, torch.Tensor) else value)
        metrics.update(self._wrapped_metrics(training=False))
        if not metrics:
            raise TrainingError("the validation data loader yielded no batches on any slot")
        searcher_metric = self.config.searcher.metric
        if searcher_metric not in metrics and self.metric_required:
            source = "evaluate_full_dataset" if full is not None else "evaluate_batch"
            raise SearcherMetricError(
                f"searcher.metric {searcher_metric!r} is not among the validation metrics "
                f"that {source} returned ({', '.join(sorted(metrics))})"
            )
        self.state.last_validation = self.state.total_batches
        self.state.validation_metrics = metrics
        self.last_validation = metrics
        improved = False
        value = metrics.get(searcher_metric)
        if value is not None:
            best = self.state.best_metric
            smaller = self.config.searcher.smaller_is_better
            improved = best is None or (value < best if smaller else value > best)
            if improved:
                self.state.best_metric = value
        if self.session is not None:
            self.session.report_validation_metrics(
                MetricsReport(self.state.total_batches, self.state.epoch, metrics)
            )
        self._just_validated = True
        self._call("on_validation_end", dict(metrics))
        return improved

    def _lockstep(self, batches: Iterable[Any]) -> Iterator[tuple[Any, bool]]:
        """Validation batches with whether each counts. Under a strategy whose forward is
        a collective (FSDP), ranks agree before each batch whether any has one left; a
        rank out of batches evaluates its last one again, not counted, so that every rank
        runs as many forwards."""
        if not (self.context._strategy.forward_is_collective and self.dist.is_distributed):
            yield from ((batch, True) for batch in batches)
            return
        last: Any = None
        iterator = iter(batches)
        while True:
            batch = next(iterator, _END)
            if not self.dist.any(batch is not _END):
                return
            if batch is not _END:
                last = batch
                yield batch, True
                continue
            if last is None:
                last = next(iter(self.val_loader))
            yield last, False

    def _evaluate_full_dataset(self) -> dict[str, float]:
        """`evaluate_full_dataset` on rank 0 with the whole validation loader; its metrics
        (or its failure) are broadcast to the other ranks. Under a strategy whose forward
        is a collective (FSDP), every rank runs it and rank 0's answer counts."""
        answer: tuple[dict[str, float] | None, str | None] = (None, None)
        error: BaseException | None = None
        if self.dist.is_chief or self.context._strategy.forward_is_collective:
            try:
                with self.context._precision.autocast():
                    out = self.trial.evaluate_full_dataset(self.val_loader)
                if not isinstance(out, Mapping):
                    raise TrainingError(
                        "evaluate_full_dataset must return a dict of metrics, got "
                        f"{type(out).__name__}"
                    )
                answer = ({str(k): _number(str(k), v) for k, v in out.items()}, None)
            except BaseException as e:
                error = e
                answer = (None, f"{type(e).__name__}: {e}")
        metrics, failure = self.dist.broadcast(answer)
        if error is not None:
            raise error
        if metrics is None:
            raise TrainingError(f"evaluate_full_dataset failed on rank 0: {failure}")
        return metrics

    # --- checkpoints --------------------------------------------------------------------

    def _checkpoint(self) -> None:
        context = self.context
        for callback in self.callbacks.values():
            hook = type(callback).on_checkpoint_save_start
            if _check_arity(hook, (0, 1), type(callback), "()") == 1:
                info = {"total_batches": self.state.total_batches, "epoch": self.state.epoch}
                callback.on_checkpoint_save_start(info)  # type: ignore[call-arg]
            else:
                callback.on_checkpoint_save_start()
        self.state.last_checkpoint = self.state.total_batches
        self._checkpointed = True
        mid_accumulation = (
            self.state.total_batches % self.config.optimizations.aggregation_frequency != 0
        )
        mine = {
            "rng": capture_rng_state(),
            "window": self._window_values(),
            # Mid-accumulation, each rank's partial gradients are part of the state.
            "gradients": self._local_gradients() if mid_accumulation else None,
        }
        strategy = context._strategy
        uuid = new_uuid() if self.dist.is_chief else ""
        shards: dict[str, FileEntry] | None = None
        state: dict[str, Any]
        if strategy.shards_checkpoints and self.dist.is_distributed:
            uuid = self.dist.broadcast(uuid)
            state, shards = self._write_shards(uuid)
        else:
            # Full state dicts: a collective under a sharding strategy (rank 0 gets them).
            state = {
                "models": [strategy.model_state_dict(m) for m in context.models],
                "optimizers": [strategy.optimizer_state_dict(o) for o in context.optimizers],
            }
        everyone = self.dist.allgather(mine)
        if not self.dist.is_chief:
            return
        payload: dict[str, Any] = {
            **state,
            "lr_schedulers": [s.state_dict() for s in context._lr_schedulers],
            "precision": context._precision.state_dict(),
            "rng": [e["rng"] for e in everyone],
            "trial_state": {
                **asdict(self.state),
                "metric_windows": [e["window"] for e in everyone],
            },
        }
        if mid_accumulation:
            payload["gradients"] = [e["gradients"] for e in everyone]
        user_state = self.trial.state_dict()
        if user_state:
            payload["user_state"] = user_state
        if self.callbacks:
            payload["callbacks"] = {
                name: callback.state_dict() for name, callback in self.callbacks.items()
            }
        if context._scalers:
            payload["scalers"] = [s.scaler.state_dict() for s in context._scalers]
        metadata = CheckpointMetadata(
            uuid=uuid,
            total_batches=self.state.total_batches,
            epoch=self.state.epoch,
            batch_in_epoch=self.state.batch_in_epoch,
            world_size=self.dist.size,
            trial_id=context.get_trial_id(),
            hparams=context.get_hparams(),
        )
        with self._unreported(uuid, sharded=shards is not None):
            path = write_checkpoint(self.checkpoint_root, payload, metadata, shards=shards)
        self.last_checkpoint = path
        self._call("on_checkpoint_write_end", str(path))
        assert self.session is not None
        with self._unreported(uuid, sharded=shards is not None):
            self.session.report_checkpoint(CheckpointReport(path, metadata))
        self._call("on_checkpoint_end", str(path))

    @contextlib.contextmanager
    def _unreported(self, uuid: str, *, sharded: bool) -> Iterator[None]:
        """On the chief's failure to store or report a sharded checkpoint on object
        storage, delete what the other ranks uploaded of it (no manifest: never restored)."""
        try:
            yield
        except BaseException:
            if sharded and self.storage is not None:
                with contextlib.suppress(Exception):
                    self.storage.delete(uuid)
            raise

    def _write_shards(self, uuid: str) -> tuple[dict[str, Any], dict[str, FileEntry]]:
        """Every rank writes its shards of each model (with the optimizers that step it)
        into `model-NNN/` of checkpoint `uuid` (`assay.strategy._sharded`, DCP), and puts
        them where the checkpoint is stored: on one directory that every rank writes into
        (shared_fs), in place; with object storage, each rank other than the chief uploads
        its own files from its own machine (the chief's go with the manifest). Returns the
        layout record (what `restore` checks) and every rank's files with their entries,
        once every rank's are stored; every rank fails together."""
        from assay.strategy._sharded import save_sharded

        context, dist = self.context, self.dist
        strategy = context._strategy
        staging = staging_dir(self.checkpoint_root, uuid)
        uploads = self.storage is not None and not dist.is_chief
        own = self.checkpoint_root / f".tmp-{uuid}.rank{dist.rank}" if uploads else staging
        owners = [_owner_index(context.models, strategy._owner(o)) for o in context.optimizers]
        mine: dict[str, FileEntry] = {}
        failure: BaseException | None = None
        try:
            own.mkdir(parents=True, exist_ok=True)
            for i, model in enumerate(context.models):
                part = _shard_dir(i)
                written = save_sharded(
                    own / part,
                    model,
                    [o for o, owner in zip(context.optimizers, owners, strict=True) if owner == i],
                    rank=dist.rank,
                    world_size=dist.size,
                    strategy=strategy.name,
                )
                mine.update({f"{part}/{name}": entry for name, entry in written.items()})
            if uploads:
                assert self.storage is not None
                upload_part = getattr(self.storage, "upload_part", None)
                if upload_part is None:
                    raise CheckpointError(f"{self.storage!r} cannot store sharded checkpoints")
                upload_part(own, uuid)
        except BaseException as e:  # raised below, on every rank
            failure = e
        finally:
            if uploads:
                shutil.rmtree(own, ignore_errors=True)
        # Every rank's files are stored before the chief writes the manifest: a checkpoint
        # that a rank could not store is reported by none.
        if dist.any(failure is not None):
            if dist.is_chief:
                shutil.rmtree(staging, ignore_errors=True)
            raise failure or CheckpointError(
                f"sharded checkpoint {uuid}: another rank could not write or store its shards "
                "(see its log); nothing was reported"
            )
        shards: dict[str, FileEntry] = {}
        for entries in dist.allgather(mine):
            shards.update(entries)
        layout = {"models": [_shard_dir(i) for i in range(len(context.models))], "owners": owners}
        return {"sharded": layout}, shards

    def _local_gradients(self) -> list[list[torch.Tensor | None]]:
        return self.context._strategy.local_gradients(self.context.models)

    def restore(self, path: Path, recorded: Mapping[str, str] | None = None) -> None:
        """Load a checkpoint written by `_checkpoint` (any world size) into this slot.

        `recorded`: its files' sha256s as the master recorded them (on a cluster), which
        every file must match before anything is loaded."""
        metadata = verify_checkpoint(path, recorded)
        context = self.context
        # A sharded checkpoint (FSDP's) holds each model with its optimizers as every
        # rank's shards; they load onto this world's ranks, whatever wraps the model now.
        layout = load_file(path, "sharded") if "sharded.pt" in metadata.files else None
        models: list[Any] | None = None
        optimizers: list[Any] | None = None
        if layout is None:
            models = load_file(path, "models")
            optimizers = load_file(path, "optimizers")
            _match("models", len(models), len(context.models))
            _match("optimizers", len(optimizers), len(context.optimizers))
        else:
            _match("models", len(layout["models"]), len(context.models))
            _match("optimizers", len(layout["owners"]), len(context.optimizers))
        schedulers = load_file(path, "lr_schedulers")
        _match("LR schedulers", len(schedulers), len(context._lr_schedulers))
        callback_states: dict[str, Any] = {}
        if "callbacks.pt" in metadata.files:
            try:
                callback_states = dict(load_file(path, "callbacks"))
            except Exception as e:
                raise TrainingError(
                    f"checkpoint {path}: the callbacks' state does not load with "
                    f"weights_only=True ({e}); callbacks' state_dict() must hold plain "
                    "containers, numbers, strings and tensors"
                ) from None
        self._call(
            "on_checkpoint_load_start",
            {
                "uuid": metadata.uuid,
                "total_batches": metadata.total_batches,
                "models_state_dict": models,
                "optimizers_state_dict": optimizers,
                "lr_schedulers_state_dict": schedulers,
                "callbacks": callback_states,
            },
        )
        if layout is not None:
            self._load_shards(path, layout)
        try:
            strategy = context._strategy
            for model, sd in zip(context.models, models or [], strict=models is not None):
                strategy.load_model_state_dict(model, sd)
            for optimizer, sd in zip(
                context.optimizers, optimizers or [], strict=optimizers is not None
            ):
                strategy.load_optimizer_state_dict(optimizer, sd)
            for scheduler, sd in zip(context._lr_schedulers, schedulers, strict=True):
                scheduler.load_state_dict(sd)
            context._precision.load_state_dict(load_file(path, "precision"))
            if "scalers.pt" in metadata.files:
                scalers = load_file(path, "scalers")
                _match("GradScalers", len(scalers), len(context._scalers))
                for user_scaler, sd in zip(context._scalers, scalers, strict=True):
                    user_scaler.scaler.load_state_dict(sd)
            for name, callback in self.callbacks.items():
                if name in callback_states:
                    callback.load_state_dict(callback_states[name])
        except (RuntimeError, ValueError, KeyError) as e:
            raise TrainingError(
                f"checkpoint {path} does not fit this Trial's models and optimizers: {e}"
            ) from None
        if "user_state.pt" in metadata.files:
            self.trial.load_state_dict(load_user_state(path))
        state = dict(load_file(path, "trial_state"))
        windows = state.pop("metric_windows", [])
        self.state = TrainState(**state)
        self.last_validation = dict(self.state.validation_metrics)
        rank = self.dist.rank
        if rank < len(windows) and len(windows) == self.dist.size:
            self._window = {name: list(values) for name, values in windows[rank].items()}
        elif rank == 0 and windows:
            merged: dict[str, list[torch.Tensor | float]] = {}
            for window in windows:
                for name, values in window.items():
                    merged.setdefault(name, []).extend(values)
            self._window = merged
        if "gradients.pt" in metadata.files:
            self._restore_gradients(path, metadata.world_size)
        rng = load_file(path, "rng")
        if rank < len(rng):
            restore_rng_state(rng[rank])
        self.last_checkpoint = path
        self._checkpointed = True
        self._restored_uuid = metadata.uuid
        context._initial_batch = self.state.total_batches
        if self.dist.is_chief:
            log.info(
                "restored checkpoint %s at batch %d (taken on %d slot%s%s) onto %d slot%s",
                metadata.uuid,
                self.state.total_batches,
                metadata.world_size,
                "" if metadata.world_size == 1 else "s",
                ", sharded" if layout is not None else "",
                self.dist.size,
                "" if self.dist.size == 1 else "s",
            )

    def _load_shards(self, path: Path, layout: Mapping[str, Any]) -> None:
        """Load each model of sharded checkpoint `path` with the optimizers that step it
        (every rank together; resharded onto this world, or into one plain process)."""
        from assay.strategy._sharded import load_sharded

        context = self.context
        strategy = context._strategy
        owners = [_owner_index(context.models, strategy._owner(o)) for o in context.optimizers]
        if owners != list(layout["owners"]):
            raise TrainingError(
                f"checkpoint {path} pairs its optimizers with models {layout['owners']} but "
                f"the Trial's step models {owners}; restore it with the same model definition"
            )
        for i, (model, part) in enumerate(zip(context.models, layout["models"], strict=True)):
            mine = [o for o, owner in zip(context.optimizers, owners, strict=True) if owner == i]
            load_sharded(path / str(part), model, mine)

    def _restore_gradients(self, path: Path, saved_world_size: int) -> None:
        if saved_world_size != self.dist.size:
            raise TrainingError(
                f"checkpoint {path} was taken in the middle of a gradient accumulation on "
                f"{saved_world_size} slots; restore it on {saved_world_size} slots"
            )
        gradients = load_file(path, "gradients")[self.dist.rank]
        self.context._strategy.restore_local_gradients(self.context.models, gradients)


_END = object()


def _floats(values: list[torch.Tensor | float]) -> list[float]:
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    if not tensors:
        return [float(v) for v in values]
    if len({t.device for t in tensors}) == 1:
        converted = iter(torch.stack([t.reshape(()).double() for t in tensors]).tolist())
    else:
        converted = iter([float(t) for t in tensors])
    return [next(converted) if isinstance(v, torch.Tensor) else float(v) for v in values]


def _number(name: str, value: Any) -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.item())
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise TrainingError(f"metric {name!r} must be a number or a scalar tensor, got {value!r}")


def _shard_dir(index: int) -> str:
    """The directory of model `index`'s shards in a sharded checkpoint (in the order
    `assay.strategy._sharded.sharded_parts` lists them)."""
    return f"model-{index:03d}"


def _owner_index(models: list[torch.nn.Module], owner: torch.nn.Module) -> int:
    return next(i for i, model in enumerate(models) if model is owner)


def _match(what: str, saved: int, now: int) -> None:
    if saved != now:
        raise TrainingError(
            f"the checkpoint holds {saved} {what} but the Trial wrapped {now}; restore it "
            "with the same model definition"
        )


def _period(length: Any, batches_per_epoch: int | None) -> int:
    return 0 if length is None else int(length.to_batches(batches_per_epoch))


class _ReducerFactory:
    def __init__(self, spec: Reducer | Mapping[str, Reducer | MetricReducer]) -> None:
        self.spec = spec

    def __call__(self, name: str) -> MetricReducer:
        if isinstance(self.spec, Reducer):
            return BuiltinReducer(self.spec)
        choice = self.spec.get(name, Reducer.AVG)
        return BuiltinReducer(choice) if isinstance(choice, Reducer) else choice


def _reducers(spec: Any) -> _ReducerFactory:
    if isinstance(spec, Reducer):
        return _ReducerFactory(spec)
    if isinstance(spec, Mapping) and all(
        isinstance(v, Reducer | MetricReducer) for v in spec.values()
    ):
        return _ReducerFactory(spec)
    raise TrainingError(
        "evaluation_reducer() must return an assay.Reducer or a dict of metric name to "
        f"Reducer or MetricReducer, got {spec!r}"
    )
