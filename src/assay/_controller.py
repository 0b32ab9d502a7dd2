"""The training loop every slot runs: batches, validation, checkpoints, reports.

Lengths and periods count global batches (one dataloader batch on every rank), as in
Determined. Only rank 0 talks to the session; its answers are broadcast, so every rank
takes the same decisions at the same batch.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from assay._context import TrialContext
from assay._data import ShardedLoader
from assay._metric_reduction import (
    BatchMetrics,
    batch_samples,
    floats,
    metric_reducers,
    number,
    wrapped_metrics,
)
from assay._preempt import PreemptWatcher
from assay._rank_metrics import GROUP as RANK_GROUP
from assay._rank_metrics import RankMeter, rank_metrics
from assay._session import MetricsReport, Session
from assay._trial import (
    PyTorchCallback,
    Trial,
    check_callbacks,
    evaluation_mode,
)
from assay._trial_checkpoint import TrainState, TrialCheckpointer
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
        self.checkpointer = TrialCheckpointer(
            trial,
            context,
            session,
            self.callbacks,
            checkpoint_root,
            storage,
            self.config.optimizations.aggregation_frequency,
        )
        self.reducers = metric_reducers(trial.evaluation_reducer())
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
            self.context._start_profiler()
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
                        # As in Determined, the hook sees the epoch's first batch.
                        self.context._at(self.state.epoch, self.state.total_batches, 0)
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
        return {name: floats(values) for name, values in self._window.items()}

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
        metrics.update(wrapped_metrics(self.context, training=True))
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
                wrapped.reset()
        was_training = [m.training for m in context.models]
        for model in context.models:
            model.eval()
            if hasattr(model, "require_forward_param_sync"):
                # Shards may be uneven: no rank may wait on a buffer broadcast in eval.
                setattr(model, "require_forward_param_sync", False)  # noqa: B010
        batch_metrics = BatchMetrics(self.reducers)
        full: dict[str, float] | None = None
        try:
            with torch.no_grad():
                if self.evaluation == "full":
                    full = self._evaluate_full_dataset()
                batches = self.val_data.counted(0) if self.evaluation != "full" else ()
                for batch_idx, (batch, drawn, counts) in enumerate(self._lockstep(batches)):
                    batch = context.to_device(batch)
                    # Before evaluate_batch, which may change the batch it is given.
                    samples = drawn if drawn is not None else batch_samples(batch)
                    with context._precision.autocast():
                        evaluate = cast(Any, self.trial).evaluate_batch
                        if self.evaluation == "batch_idx":
                            out = evaluate(batch, batch_idx)
                        else:
                            out = evaluate(batch)
                    if counts:
                        batch_metrics.add(out, samples)
        finally:
            for model, mode in zip(context.models, was_training, strict=True):
                model.train(mode)
        metrics = dict(full) if full is not None else batch_metrics.reduce(self.dist)
        metrics.update(wrapped_metrics(self.context, training=False))
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

    def _lockstep(
        self, batches: Iterable[tuple[Any, int | None]]
    ) -> Iterator[tuple[Any, int | None, bool]]:
        """Validation batches, their numbers of samples, and whether each counts. Under a
        strategy whose forward is a collective (FSDP), ranks agree before each batch
        whether any has one left; a rank out of batches evaluates its last one again, not
        counted, so that every rank runs as many forwards."""
        if not (self.context._strategy.forward_is_collective and self.dist.is_distributed):
            yield from ((batch, samples, True) for batch, samples in batches)
            return
        last: Any = None
        iterator = iter(batches)
        while True:
            item = next(iterator, None)
            if not self.dist.any(item is not None):
                return
            if item is not None:
                last = item[0]
                yield item[0], item[1], True
                continue
            if last is None:
                last = next(iter(self.val_loader))
            yield last, None, False

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
                answer = ({str(k): number(str(k), v) for k, v in out.items()}, None)
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
        self._checkpointed = True
        path = self.checkpointer.save(self.state, self._window_values)
        if path is not None:
            self.last_checkpoint = path

    def restore(self, path: Path, recorded: Mapping[str, str] | None = None) -> None:
        """Continue from checkpoint `path` (`TrialCheckpointer.restore`)."""
        restored = self.checkpointer.restore(path, recorded)
        self.state = restored.state
        self.last_validation = dict(self.state.validation_metrics)
        self._window = restored.window
        self.last_checkpoint = path
        self._checkpointed = True
        self._restored_uuid = restored.uuid
        self.context._initial_batch = self.state.total_batches


def _period(length: Any, batches_per_epoch: int | None) -> int:
    return 0 if length is None else int(length.to_batches(batches_per_epoch))
