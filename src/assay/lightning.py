"""Lightning's `Trainer` on Assay: one callback reports, checkpoints, stops and resumes.

    import assay, assay.core, lightning as L
    from assay.lightning import AssayCallback

    with assay.core.init() as core:
        assay_cb = AssayCallback(core)
        trainer = L.Trainer(max_steps=assay_cb.max_steps(default=1000), callbacks=[assay_cb])
        assay_cb.fit(trainer, model, train_loader, val_loader)

The searcher's lengths count Lightning's `global_step` (optimizer steps). The callback:
- reports what the LightningModule logs (`self.log`): the values logged in training every
  `log_every_n_steps`, and those logged in validation after each validation, at the
  step it ran at (rank 0; the searcher reads `searcher.metric` among them). On several
  ranks a validation value is reduced over every rank's batches as `sync_dist=True`
  would (a mean weighted by batch size, as Lightning weighs a rank's own batches),
  whether or not the module asked for it, and the ranks share the validation samples
  without the repeats Lightning's DistributedSampler pads them with, wherever every rank
  still gets as many batches (else rank 0 warns how many samples count twice): the
  reported metrics are those of the whole validation set, on any number of slots;
- stores a checkpoint (`trainer.save_checkpoint`, every rank taking part as Lightning's
  strategies need) at the end of every epoch (after every other callback), when the
  cluster asks the trial to stop (a pause, a preemption, an ASHA rung), and at the end of
  training;
- asks `should_preempt()` once per optimizer step and at each epoch's end, on every rank, and
  stops the Trainer there after storing a checkpoint;
- gives `fit` the trial's latest checkpoint to resume from (after a pause, a restart, a
  promotion), and validates once more after training when the last step was not
  validated: Lightning does not validate when `max_steps` ends an epoch early, and the
  searcher needs a validation at its target.

The epoch's checkpoint is taken after every other callback has ended the epoch: one
taken earlier (in a validation, or before EarlyStopping's check) makes Lightning run the
rest of the epoch's end again on resume, before any validation, and an `EarlyStopping`
on a validation metric then fails. Strategies that write one checkpoint file (one device,
DDP) are supported.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping, Sized
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler

try:
    from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer
except ModuleNotFoundError as e:  # Lightning is not one of Assay's own dependencies
    if e.name is None or e.name.split(".")[0] != "lightning":
        raise
    raise ModuleNotFoundError(
        "assay.lightning needs Lightning, which is not installed in this Python "
        f"({e}): pip install 'lightning>=2.4' (Assay's `examples` extra brings it), on "
        "every machine whose agent runs such trials",
        name="lightning",
    ) from None

import assay
from assay.core import Context

log = logging.getLogger("assay")

CHECKPOINT_FILE = "lightning.ckpt"


def _numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics that are one number (tensors of one element included)."""
    out: dict[str, float] = {}
    for name, value in metrics.items():
        with contextlib.suppress(TypeError, ValueError, RuntimeError):
            out[name] = float(value)
    return out


def _changed(now: Mapping[str, Any], before: Mapping[str, Any]) -> dict[str, Any]:
    """The metrics logged since `before` was taken: Lightning stores a new tensor for each
    value logged, and leaves the others as they were."""
    return {k: v for k, v in now.items() if before.get(k) is not v}


class AssayCallback(Callback):
    """See the module docstring. `core`: the context `assay.core.init()` gave."""

    def __init__(self, core: Context, *, report_every_n_steps: int | None = None) -> None:
        self.core = core
        self.every = report_every_n_steps
        self._info = assay.get_cluster_info()
        self._restore: contextlib.ExitStack | None = None
        self._last_validated = -1
        self._last_saved = -1
        self._asked_at = -1
        self._before_validation: dict[str, Any] = {}
        # This rank's sums of what validation logged, read before Lightning reduces them
        # (on several ranks; None if Lightning's results were not as expected).
        self._sums: dict[str, tuple[str, torch.Tensor, torch.Tensor]] | None = {}
        self._reading = False  # whether Lightning's reductions are watched for them
        self._seen: dict[str, Any] = {}  # the metrics as of the last report
        self._trained_reported = -1  # the step of the last training report
        self.preempted = False
        self._last_metrics: dict[str, Any] = {}
        self._restored_metrics: dict[str, float] = {}

    # --- what to pass the Trainer and fit ------------------------------------------------

    def max_steps(self, default: int) -> int:
        """The searcher's length on a cluster or under run-local (in optimizer steps),
        else `default` (a plain `python3 train.py`)."""
        info = self._info
        if info is None or not info.trial.max_length:
            return default
        return int(info.trial.max_length)

    def ckpt_path(self) -> str | None:
        """The Lightning checkpoint of the trial's latest Assay checkpoint, for
        `trainer.fit(ckpt_path=...)`; None when the trial starts fresh. It stays readable
        until `fit` ends."""
        info = self._info
        if info is None or not info.latest_checkpoint:
            return None
        if self._restore is None:
            self._restore = contextlib.ExitStack()
            path = self._restore.enter_context(
                self.core.checkpoint.restore_path(info.latest_checkpoint)
            )
            self._restored = path / CHECKPOINT_FILE
            if not self._restored.is_file():
                self._restore.close()
                self._restore = None
                raise assay.errors.AssayError(
                    f"checkpoint {info.latest_checkpoint} holds no {CHECKPOINT_FILE}: it was "
                    "not stored by AssayCallback, so Lightning cannot resume from it"
                )
        return str(self._restored)

    def fit(
        self,
        trainer: Trainer,
        model: LightningModule,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        datamodule: Any = None,
    ) -> None:
        """`trainer.fit` from the trial's latest checkpoint, then one more validation if
        training ended at a step that was not validated (and was not stopped early by
        the cluster)."""
        if isinstance(train_dataloaders, LightningDataModule):  # Lightning's fit(model, dm)
            datamodule, train_dataloaders = train_dataloaders, None
        callbacks: list[Callback] = trainer.callbacks  # type: ignore[attr-defined]
        if self not in callbacks:
            raise assay.errors.AssayError(
                "pass this AssayCallback to the Trainer: L.Trainer(callbacks=[assay_cb])"
            )
        # Last, after Lightning's own callbacks (it puts its ModelCheckpoints last): a
        # checkpoint taken before another callback has ended the epoch makes Lightning run
        # that callback's end of the epoch again on resume (EarlyStopping then fails:
        # no validation metric yet).
        callbacks.remove(self)
        callbacks.append(self)
        try:
            trainer.fit(
                model,
                train_dataloaders=train_dataloaders,
                val_dataloaders=val_dataloaders,
                datamodule=datamodule,
                ckpt_path=self.ckpt_path(),
            )
        finally:
            if self._restore is not None:
                self._restore.close()
                self._restore = None
        if (
            self._last_validated < trainer.global_step
            and _validates(trainer, model, val_dataloaders, datamodule)
            and not self.preempted
            and not trainer.interrupted
        ):
            if val_dataloaders is not None:
                trainer.validate(model, dataloaders=val_dataloaders)
            elif datamodule is not None:
                trainer.validate(model, datamodule=datamodule)
            else:
                trainer.validate(model)  # the module's own val_dataloader

    # --- Lightning's hooks ---------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        # The metrics of the last validation: Lightning runs the end of the checkpoint's
        # epoch again on resume, where an EarlyStopping checks its metric, which would be
        # missing until the next validation.
        return {
            "callback_metrics": _numbers(self._last_metrics),
            "last_validated": self._last_validated,
            # Lightning runs the epoch's end again on resume: not reported twice.
            "training_reported": self._trained_reported,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restored_metrics = dict(state_dict.get("callback_metrics", {}))
        self._last_validated = int(state_dict.get("last_validated", -1))
        self._trained_reported = int(state_dict.get("training_reported", -1))

    def on_load_checkpoint(
        self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # Lightning (2.6) resumes a checkpoint taken at an epoch's end one epoch too far
        # when max_steps is set, as it always is here: its step-based path marks the fit
        # loop as restarting mid-epoch and skips the epoch count's fix-up, so max_epochs=3
        # resumed from epoch 1's end trains one batch (a promoted ASHA trial, none). Only
        # the loops' restore is told "not step-based", until on_train_start: max_steps
        # stays as it is, so configure_optimizers (run after this hook) still sees it, and
        # estimated_stepping_batches (a OneCycleLR's total_steps) is not inf.
        trainer.fit_loop._iteration_based_training = lambda: False  # type: ignore[method-assign]

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        trainer.fit_loop.__dict__.pop("_iteration_based_training", None)
        if self._restored_metrics:
            import torch

            for name, value in self._restored_metrics.items():
                trainer.callback_metrics.setdefault(name, torch.tensor(value))
        # Reported before the checkpoint: not training's to report again after it.
        self._seen = dict(trainer.callback_metrics)
        if self._restore is not None:
            self._last_saved = trainer.global_step  # resumed from that very checkpoint

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        step = trainer.global_step
        if step == self._asked_at:
            return  # a micro-batch of gradient accumulation: no optimizer step yet
        self._asked_at = step
        every = self.every or getattr(trainer, "log_every_n_steps", 0) or 1
        if step > 0 and step % every == 0:
            self._report_training(trainer)
        self._stop_if_asked(trainer)

    def _report_training(self, trainer: Trainer) -> None:
        """Report what training logged since the last report (a validation's values were
        taken out at its end, so a name both log, "loss", is reported in each); once a
        step, rank 0."""
        step = trainer.global_step
        if not trainer.is_global_zero or step == self._trained_reported:
            return
        now = trainer.callback_metrics
        logged = _changed(now, self._seen)
        self._seen = dict(now)
        if numbers := _numbers(logged):
            self.core.train.report_training_metrics(steps_completed=step, metrics=numbers)
            self._trained_reported = step

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # The epoch's own values (`on_epoch=True`), unless this step was reported already.
        self._report_training(trainer)
        # `fit` put this callback last: every other callback has ended the epoch
        # (EarlyStopping's check, for one), so the checkpoint resumes at the next epoch.
        if not self._stop_if_asked(trainer):
            self._save(trainer)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if trainer.world_size > 1:
            _validate_unpadded(trainer)
            _read_before_reducing(trainer, self)

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._before_validation = dict(trainer.callback_metrics)
        self._sums = {} if self._reading else None

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking:
            return
        after = trainer.callback_metrics
        logged = _changed(after, self._before_validation)
        self._seen = dict(after)  # not training's to report
        self._last_metrics = dict(after)
        step = trainer.global_step
        self._last_validated = step
        exact = _across_ranks(self._sums)  # a collective, on every rank
        if trainer.is_global_zero and (numbers := _numbers(logged)):
            numbers.update({k: v for k, v in exact.items() if k in numbers})
            self.core.train.report_validation_metrics(steps_completed=step, metrics=numbers)
        # A validation at the searcher's target ends the target: ask now (every rank
        # validates), so the trial stops at this step, checkpointed with these metrics,
        # not one batch later at the next on_train_batch_end.
        if trainer.state.fn == "fit":  # not a trainer.validate() after fit
            self._stop_if_asked(trainer)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._save(trainer)

    # --- checkpoints ---------------------------------------------------------------------

    def _stop_if_asked(self, trainer: Trainer) -> bool:
        """Ask the cluster (a collective: every rank asks); if it wants the trial to stop,
        store a checkpoint and stop the Trainer."""
        if self.preempted or not self.core.preempt.should_preempt():
            return self.preempted
        self._save(trainer)
        self.preempted = True
        trainer.should_stop = True
        # Lightning validates before it stops early (for EarlyStopping's sake); the
        # cluster's stop needs no validation, only the checkpoint, within the grace.
        epoch_loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
        if epoch_loop is not None and hasattr(epoch_loop, "_skip_next_val"):
            epoch_loop._skip_next_val = True
        log.info("step %d: stopped at a checkpoint, as the cluster asked", trainer.global_step)
        return True

    def _save(self, trainer: Trainer) -> None:
        """Store Lightning's checkpoint as an Assay checkpoint, once per step; every
        rank takes part (Lightning's strategies gather and synchronise), rank 0 writes."""
        step = trainer.global_step
        if step == self._last_saved or step == 0:
            return
        self._last_saved = step
        metadata = {"steps_completed": step, "epoch": trainer.current_epoch}
        with self.core.checkpoint.store_path(metadata, shard=True) as (path, _):
            trainer.save_checkpoint(str(Path(path) / CHECKPOINT_FILE))


def _validates(
    trainer: Trainer, model: LightningModule, val_dataloaders: Any, datamodule: Any
) -> bool:
    """Whether `fit` has a validation to run: a `validation_step`, data for it, and
    `limit_val_batches` not 0."""
    from lightning.pytorch.utilities.model_helpers import is_overridden

    if not is_overridden("validation_step", model) or trainer.limit_val_batches == 0:
        return False
    if val_dataloaders is not None:
        return True
    if datamodule is not None:
        return is_overridden("val_dataloader", datamodule)
    return is_overridden("val_dataloader", model)


def _validate_unpadded(trainer: Trainer) -> None:
    """Have the Trainer shard validation data without repeats where that keeps every rank
    to as many batches: Lightning's DistributedSampler pads each rank's share to the same
    length with samples from the start, which a validation then counts twice. Lightning's
    UnrepeatedDistributedSampler (what it uses to predict) leaves the shares a sample
    apart; where that would give one rank a batch more (a per-step `sync_dist` or any
    other collective in `validation_step` would then wait forever), the padding stays
    and rank 0 says how many samples count twice."""
    from lightning.pytorch.overrides.distributed import (
        UnrepeatedDistributedSampler,
        UnrepeatedDistributedSamplerWrapper,
    )
    from lightning.pytorch.trainer.states import RunningStage
    from lightning.pytorch.utilities.data import _update_dataloader

    connector: Any = getattr(trainer, "_data_connector", None)
    prepare = getattr(connector, "_prepare_dataloader", None)
    if prepare is None or getattr(prepare, "assay", False):
        if prepare is None:
            log.warning("this Lightning's validation shares are its own (padded with repeats)")
        return

    def prepare_unpadded(dataloader: object, shuffle: bool, mode: RunningStage) -> object:
        if not (
            mode == RunningStage.VALIDATING
            and isinstance(dataloader, DataLoader)
            and connector._requires_distributed_sampler(dataloader)
            and isinstance(dataloader.sampler, Sized)
            and len(dataloader.sampler) % trainer.world_size
        ):
            return prepare(dataloader, shuffle, mode)
        samples, world = len(dataloader.sampler), trainer.world_size
        if not _as_many_batches(samples, world, dataloader.batch_size, dataloader.drop_last):
            if trainer.is_global_zero:
                log.warning(
                    "validation: Lightning's DistributedSampler repeats %d of the %d samples "
                    "so that the %d ranks run as many batches; they count twice in the "
                    "validation metrics (a set whose size %d divides, or whose shares make "
                    "as many batches on every rank, counts each sample once)",
                    -samples % world,
                    samples,
                    world,
                    world,
                )
            return prepare(dataloader, shuffle, mode)
        kwargs = dict(trainer.distributed_sampler_kwargs or {})
        kwargs["shuffle"] = shuffle and not getattr(trainer, "overfit_batches", 0)
        kwargs.setdefault("seed", int(os.getenv("PL_GLOBAL_SEED", "0")))
        sampler = dataloader.sampler
        if isinstance(sampler, RandomSampler | SequentialSampler):  # as Lightning does
            unpadded: Any = UnrepeatedDistributedSampler(dataloader.dataset, **kwargs)
        else:
            unpadded = UnrepeatedDistributedSamplerWrapper(sampler, **kwargs)
        return _update_dataloader(dataloader, unpadded, mode=mode)

    prepare_unpadded.assay = True  # type: ignore[attr-defined]
    connector._prepare_dataloader = prepare_unpadded


def _as_many_batches(samples: int, world: int, batch_size: int | None, drop_last: bool) -> bool:
    """Whether unpadded shares of `samples` (`samples // world` or one more) make as
    many batches on every rank; False when the batch size is not known."""
    small, large = samples // world, -(-samples // world)
    if batch_size is None or small == 0:
        return False
    if drop_last:
        return small // batch_size == large // batch_size
    return -(-small // batch_size) == -(-large // batch_size)


def _read_before_reducing(trainer: Trainer, callback: AssayCallback) -> None:
    """Before Lightning reduces a validation's logged values (after each dataloader's
    last batch, and after `on_validation_epoch_end`), copy this rank's sums of those not
    reduced yet into `callback._sums`: a `sync_dist` mean overwrites its batch-size sum
    with the ranks' mean, in place. That mean is an integer tensor, truncated (50
    samples on 3 ranks: 16), so the sums become floats first, for Lightning's own
    `sync_dist` means (what its callbacks see) to be exact on the uneven shards too."""
    connector: Any = getattr(trainer, "_logger_connector", None)
    update = getattr(connector, "update_eval_epoch_metrics", None)
    if update is None:
        return  # callback._sums stays None: the reports warn the metrics are rank 0's
    callback._reading = True
    if getattr(update, "assay", False):
        return

    def read_then_update() -> Any:
        if callback._sums is not None:
            sums = _rank_sums(trainer)
            callback._sums = None if sums is None else {**sums, **callback._sums}
        return update()

    read_then_update.assay = True  # type: ignore[attr-defined]
    connector.update_eval_epoch_metrics = read_then_update


def _rank_sums(trainer: Trainer) -> dict[str, tuple[str, torch.Tensor, torch.Tensor]] | None:
    """This rank's (reduction, sum or extreme, batch-size sum) of each tensor value logged
    with `on_epoch` and not reduced yet, by the names Lightning gives it (the batch-size
    sums made floats); None if Lightning's result collection is not as expected."""
    try:
        results = trainer._results
        assert results is not None
        sums: dict[str, tuple[str, torch.Tensor, torch.Tensor]] = {}
        for metric in results.values():
            meta = metric.meta
            if metric.has_reset or not metric.is_tensor or not meta.on_epoch:
                continue
            if metric._computed is not None:
                continue
            zero = torch.zeros((), dtype=metric.value.dtype)
            if meta.is_mean_reduction:
                count = metric.cumulated_batch_size.to(metric.value.dtype)
                metric.cumulated_batch_size = count
                entry = ("mean", metric.value.detach().clone(), count.detach().clone())
            elif meta.is_sum_reduction:
                entry = ("sum", metric.value.detach().clone(), zero)
            elif meta.is_max_reduction or meta.is_min_reduction:
                kind = "max" if meta.is_max_reduction else "min"
                entry = (kind, metric.value.detach().clone(), zero)
            else:
                continue
            for name in set(results._forked_name(metric, on_step=False)):
                sums[name] = entry
        return sums
    except (AttributeError, AssertionError, TypeError):
        return None


def _distributed() -> bool:
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _across_ranks(
    sums: dict[str, tuple[str, torch.Tensor, torch.Tensor]] | None,
) -> dict[str, float]:
    """Each value a validation logged, reduced over every rank's batches as `sync_dist`
    means to (mean: the sum of value x batch size over the sum of batch sizes; sum, min,
    max) from every rank's `sums`. Every rank calls it (a collective); one process:
    nothing (Lightning's values are exact there)."""
    if not _distributed():
        return {}
    mine = None if sums is None else {k: (t, float(v), float(n)) for k, (t, v, n) in sums.items()}
    everyone: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(everyone, mine)
    if any(rank is None for rank in everyone):
        log.warning("validation metrics are rank 0's: this Lightning keeps no sums to reduce")
        return {}
    exact: dict[str, float] = {}
    for name in {name for rank in everyone for name in rank}:
        parts = [rank[name] for rank in everyone if name in rank]
        kind = parts[0][0]
        if kind == "mean":
            count = sum(p[2] for p in parts)
            if count:
                exact[name] = sum(p[1] for p in parts) / count
        elif kind == "sum":
            exact[name] = sum(p[1] for p in parts)
        else:
            exact[name] = (max if kind == "max" else min)(p[1] for p in parts)
    return exact


__all__ = ["CHECKPOINT_FILE", "AssayCallback"]
