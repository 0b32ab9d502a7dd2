"""A Trial's checkpoints: what every rank writes, and how a slot loads one back.

A checkpoint holds the wrapped models, optimizers, LR schedulers, precision and
GradScaler state, every rank's RNG and pending training metrics, the partial gradients
of an accumulation it stopped in the middle of, the Trial's and its callbacks' own state,
and the loop's counters (`TrainState`), so a restored trial continues exactly as it
would have, on any number of slots (only mid-accumulation needs the same number).
Under a sharding strategy (FSDP) each model is written as every rank's shards.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

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
from assay._session import CheckpointReport, Session
from assay._trial import PyTorchCallback, Trial, _check_arity
from assay.common.storage import StorageManager
from assay.errors import TrainingError

log = logging.getLogger("assay")

# A rank's pending training metric values, by name, in batch order.
Window = dict[str, list[torch.Tensor | float]]


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
class Restored:
    """What a slot continues from: the loop's counters and this rank's pending metrics."""

    state: TrainState
    window: Window
    uuid: str


class TrialCheckpointer:
    """Writes and restores one Trial's checkpoints on this slot (every rank calls both:
    they hold collectives; only the chief writes the files that are not shards and
    reports the checkpoint)."""

    def __init__(
        self,
        trial: Trial,
        context: TrialContext,
        session: Session | None,
        callbacks: Mapping[str, PyTorchCallback],
        checkpoint_root: Path,
        storage: StorageManager | None,
        aggregation_frequency: int,
    ) -> None:
        self.trial = trial
        self.context = context
        self.dist = context.distributed
        self.session = session
        self.callbacks = callbacks
        self.checkpoint_root = checkpoint_root
        self.storage = storage
        self.aggregation_frequency = aggregation_frequency

    def _call(self, hook: str, *args: Any) -> None:
        for callback in self.callbacks.values():
            getattr(callback, hook)(*args)

    # --- writing ------------------------------------------------------------------------

    def save(self, state: TrainState, window: Callable[[], dict[str, list[float]]]) -> Path | None:
        """Checkpoint at `state.total_batches` (which it records as `last_checkpoint`);
        `window` gives this rank's pending training metrics as floats. Returns the
        checkpoint's directory on the chief, None on the other ranks."""
        context = self.context
        for callback in self.callbacks.values():
            hook = type(callback).on_checkpoint_save_start
            if _check_arity(hook, (0, 1), type(callback), "()") == 1:
                info = {"total_batches": state.total_batches, "epoch": state.epoch}
                callback.on_checkpoint_save_start(info)  # type: ignore[call-arg]
            else:
                callback.on_checkpoint_save_start()
        state.last_checkpoint = state.total_batches
        mid_accumulation = state.total_batches % self.aggregation_frequency != 0
        # At a boundary, gradients a Trial left on purpose (a backward after its step,
        # as some GAN loops do) are state too, where the strategy can save them.
        keep_gradients = mid_accumulation or self._left_gradients()
        mine = {
            "rng": capture_rng_state(),
            "window": window(),
            # Mid-accumulation, each rank's partial gradients are part of the state.
            "gradients": self._local_gradients() if keep_gradients else None,
        }
        strategy = context._strategy
        uuid = new_uuid() if self.dist.is_chief else ""
        shards: dict[str, FileEntry] | None = None
        weights: dict[str, Any]
        if strategy.shards_checkpoints and self.dist.is_distributed:
            uuid = self.dist.broadcast(uuid)
            weights, shards = self._write_shards(uuid)
        else:
            # Full state dicts: a collective under a sharding strategy (rank 0 gets them).
            weights = {
                "models": [strategy.model_state_dict(m) for m in context.models],
                "optimizers": [strategy.optimizer_state_dict(o) for o in context.optimizers],
            }
        everyone = self.dist.allgather(mine)
        if not self.dist.is_chief:
            return None
        payload: dict[str, Any] = {
            **weights,
            "lr_schedulers": [s.state_dict() for s in context._lr_schedulers],
            "precision": context._precision.state_dict(),
            "rng": [e["rng"] for e in everyone],
            "trial_state": {
                **asdict(state),
                "metric_windows": [e["window"] for e in everyone],
            },
            # A file of its own: an older release, which knows no such key in trial_state,
            # restores the checkpoint without it.
            "scheduler_ticks": context._scheduler_ticks,
        }
        if any(e["gradients"] is not None for e in everyone):
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
            total_batches=state.total_batches,
            epoch=state.epoch,
            batch_in_epoch=state.batch_in_epoch,
            world_size=self.dist.size,
            trial_id=context.get_trial_id(),
            hparams=context.get_hparams(),
        )
        with self._unreported(uuid, sharded=shards is not None):
            path = write_checkpoint(self.checkpoint_root, payload, metadata, shards=shards)
        self._call("on_checkpoint_write_end", str(path))
        assert self.session is not None
        with self._unreported(uuid, sharded=shards is not None):
            self.session.report_checkpoint(CheckpointReport(path, metadata))
        self._call("on_checkpoint_end", str(path))
        return path

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
        from assay.strategy import save_sharded

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

    def _left_gradients(self) -> bool:
        """Whether this rank holds gradients between accumulations (normally zeroed by
        `step_optimizer`) that its strategy can checkpoint."""
        if not self.context._strategy.saves_partial_gradients:
            return False
        return any(
            p.grad is not None and bool(p.grad.any())  # zeroed in place counts as none
            for m in self.context.models
            for p in m.parameters()
        )

    # --- restoring ----------------------------------------------------------------------

    def restore(self, path: Path, recorded: Mapping[str, str] | None = None) -> Restored:
        """Load a checkpoint written by `save` (any world size) into this slot.

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
        callback_states = self._callback_states(path, metadata)
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
        saved = dict(load_file(path, "trial_state"))
        windows = saved.pop("metric_windows", [])
        state = TrainState(**saved)
        if "scheduler_ticks.pt" in metadata.files:  # absent from older checkpoints
            context._scheduler_ticks = list(load_file(path, "scheduler_ticks"))
        if "gradients.pt" in metadata.files:
            mid = metadata.total_batches % self.aggregation_frequency != 0
            self._restore_gradients(path, metadata.world_size, mid_accumulation=mid)
        rng = load_file(path, "rng")
        if self.dist.rank < len(rng):
            restore_rng_state(rng[self.dist.rank])
        if self.dist.is_chief:
            log.info(
                "restored checkpoint %s at batch %d (taken on %d slot%s%s) onto %d slot%s",
                metadata.uuid,
                state.total_batches,
                metadata.world_size,
                "" if metadata.world_size == 1 else "s",
                ", sharded" if layout is not None else "",
                self.dist.size,
                "" if self.dist.size == 1 else "s",
            )
        return Restored(state, self._my_window(windows), metadata.uuid)

    def _callback_states(self, path: Path, metadata: CheckpointMetadata) -> dict[str, Any]:
        if "callbacks.pt" not in metadata.files:
            return {}
        try:
            return dict(load_file(path, "callbacks"))
        except Exception as e:
            raise TrainingError(
                f"checkpoint {path}: the callbacks' state does not load with "
                f"weights_only=True ({e}); callbacks' state_dict() must hold plain "
                "containers, numbers, strings and tensors"
            ) from None

    def _my_window(self, windows: list[dict[str, list[float]]]) -> Window:
        """This rank's pending training metrics: its own on the same world size; on
        another, the chief takes every saved rank's (they are reported at the next
        report, averaged as they would have been)."""
        rank = self.dist.rank
        if rank < len(windows) and len(windows) == self.dist.size:
            return {name: list(values) for name, values in windows[rank].items()}
        merged: Window = {}
        if rank == 0:
            for window in windows:
                for name, values in window.items():
                    merged.setdefault(name, []).extend(values)
        return merged

    def _load_shards(self, path: Path, layout: Mapping[str, Any]) -> None:
        """Load each model of sharded checkpoint `path` with the optimizers that step it
        (every rank together; resharded onto this world, or into one plain process)."""
        from assay.strategy import load_sharded

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

    def _restore_gradients(
        self, path: Path, saved_world_size: int, *, mid_accumulation: bool
    ) -> None:
        if saved_world_size != self.dist.size:
            if not mid_accumulation:
                if self.dist.is_chief:
                    log.warning(
                        "checkpoint %s holds gradients left after an optimizer step on %d "
                        "slots; on %d slots they are dropped, so training continues as "
                        "if they had been zeroed",
                        path,
                        saved_world_size,
                        self.dist.size,
                    )
                return
            raise TrainingError(
                f"checkpoint {path} was taken in the middle of a gradient accumulation on "
                f"{saved_world_size} slots; restore it on {saved_world_size} slots"
            )
        gradients = load_file(path, "gradients")[self.dist.rank]
        if gradients is not None:
            self.context._strategy.restore_local_gradients(self.context.models, gradients)


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
