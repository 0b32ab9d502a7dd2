"""`assay.core.init()`: the Core API's contexts, assembled for where the script runs.

- On a cluster (the agent set `ASSAY_TRIAL_SPEC`): reports go to the master, checkpoints
  to the experiment's `checkpoint_storage`, and preemption follows the master.
- Under `assay trial run-local` (`ASSAY_LOCAL_SPEC`): the run's directories, its
  hyperparameters, and `searcher.max_length` as the one target.
- Anywhere else (plain `python train.py`): a local twin. Metrics are printed and appended
  to `./assay-metrics/metrics.jsonl`, checkpoints go to `./checkpoints/<uuid>`, and
  `should_preempt()` is always False. The same script runs unchanged on a laptop and on
  the cluster.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import TYPE_CHECKING, Any, overload

from assay._backend import Backend, ClosedBackend, ClusterBackend, LocalBackend
from assay._checkpoint import CheckpointError, check_writable, cluster_storage_fix
from assay.common.spec import ClusterSpec, LocalSpec, spec_from_env
from assay.common.storage import SharedFSStorage, StorageManager, storage_for, trial_storage
from assay.core._checkpoint import CheckpointContext
from assay.core._distributed import DistributedContext
from assay.core._info import ClusterInfo, info_from_spec
from assay.core._preempt import PreemptContext, PreemptMode
from assay.core._searcher import SearcherContext, _SearchState
from assay.core._tensorboard import TensorBoardFiles
from assay.core._train import TrainContext
from assay.errors import (
    INVALID_HP_EXIT_CODE,
    PERMANENT_ERROR_EXIT_CODE,
    InvalidHP,
    PermanentError,
)

if TYPE_CHECKING:
    import torch

    from assay.config import OptimizationsConfig
    from assay.strategy import Strategy

log = logging.getLogger("assay")

DEFAULT_CHECKPOINT_DIR = "checkpoints"
DEFAULT_METRICS_PATH = "assay-metrics/metrics.jsonl"


class Context:
    """The Core API: `distributed`, `train`, `checkpoint`, `preempt`, `searcher`, and
    `info` (this trial's `ClusterInfo`, None for a plain local run). Close it when done
    (`with assay.core.init() as core:` does)."""

    def __init__(
        self,
        *,
        distributed: DistributedContext,
        train: TrainContext,
        checkpoint: CheckpointContext,
        preempt: PreemptContext,
        searcher: SearcherContext,
        info: ClusterInfo | None,
        backend: Backend | None,
        tensorboard: TensorBoardFiles,
        optimizations: OptimizationsConfig | None = None,
    ) -> None:
        self.distributed = distributed
        self.train = train
        self.checkpoint = checkpoint
        self.preempt = preempt
        self.searcher = searcher
        self.info = info
        self._backend = backend
        self._tensorboard = tensorboard
        self._optimizations = optimizations
        self._strategy: Strategy | None = None

    @overload
    def setup(self, model: torch.nn.Module) -> torch.nn.Module: ...
    @overload
    def setup(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[torch.nn.Module, torch.optim.Optimizer]: ...
    def setup(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None
    ) -> torch.nn.Module | tuple[torch.nn.Module, torch.optim.Optimizer]:
        """Distribute `model` as the experiment's `optimizations.strategy` says (Lightning
        Fabric's `setup`): moved to this slot's device, then wrapped in DDP or sharded with
        FSDP on several processes (one process: no wrapper). `optimizer` is pointed at the
        wrapped model's parameters, so it may be built before `setup`, but must not have
        stepped. Joins the process group if the script has not. `core.strategy` then gives
        the no-sync context, global-norm clipping and full state dicts."""
        strategy = self.strategy
        wrapped = strategy.wrap_model(model)
        if optimizer is None:
            return wrapped
        return wrapped, strategy.wrap_optimizer(optimizer)

    @property
    def strategy(self) -> Strategy:
        """The strategy `setup` wraps with (made on first use)."""
        if self._strategy is None:
            import torch

            from assay.config import OptimizationsConfig
            from assay.strategy import make_strategy

            if self.distributed.size > 1:
                self.distributed._join()
            device = torch.device("cpu")
            if torch.cuda.is_available():
                index = self.distributed.local_rank % torch.cuda.device_count()
                torch.cuda.set_device(index)
                device = torch.device("cuda", index)
            options = self._optimizations or OptimizationsConfig()
            self._strategy = make_strategy(options, self.distributed, device)
        return self._strategy

    def __enter__(self) -> Context:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Leaving with an exception: the other processes may be inside a collective, so
        # this one does not wait for them (its exit stops them).
        self.close(together=exc_type is None)

    def close(self, *, together: bool = True) -> None:
        """Stop the preemption watcher, upload the TensorBoard files written since the
        last checkpoint (object storage), close the connection to the master, and leave
        the process group if `init()` joined it: with every process (`together`), or
        alone."""
        self.preempt.close()
        self._tensorboard.close()
        if self._backend is not None:
            self._backend.close()
            self._backend = None
            closed: Any = ClosedBackend()
            if self.train._backend is not None:
                self.train._backend = closed
            if self.checkpoint._backend is not None:
                self.checkpoint._backend = closed
            if self.searcher._state.backend is not None:
                self.searcher._state.backend = closed
        self.distributed.close(together=together)


_EXIT_HOOKED = False  # whether `_exit_codes_of_errors` has set its hook


def _exit_codes_of_errors() -> None:
    """An error that ends a trial's script exits as a Trial's would, after Python prints
    it: a `PermanentError` (a validation without the searcher's metric, ...) 78, so the
    trial ends in ERROR at once instead of restarting into the same failure; an
    `assay.InvalidHP` 77, so the searcher replaces the trial instead of restarting it."""
    global _EXIT_HOOKED
    if _EXIT_HOOKED:
        return
    _EXIT_HOOKED = True
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        previous(kind, exc, tb)
        code = (
            INVALID_HP_EXIT_CODE
            if isinstance(exc, InvalidHP)
            else PERMANENT_ERROR_EXIT_CODE
            if isinstance(exc, PermanentError)
            else None
        )
        if code is not None:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    sys.excepthook = hook


def init(
    *,
    distributed: DistributedContext | None = None,
    checkpoint_storage: str | os.PathLike[str] | dict[str, Any] | None = None,
    preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
    tensorboard_mode: Any = None,
    async_checkpointing: bool = False,
) -> Context:
    """The Core API's contexts for this process (see the module docstring).

    `distributed`: who this process is; by default read from torchrun's variables.
    `checkpoint_storage`: off the cluster only, a directory (or a `checkpoint_storage`
    mapping of the experiment config) instead of `./checkpoints`; on a cluster the
    experiment's storage is used and this is ignored with a warning.
    """
    from assay.config import parse_config

    if distributed is None:
        distributed = DistributedContext.from_env()
    spec = spec_from_env()
    info = info_from_spec(spec) if spec is not None else None
    config = parse_config(spec.config) if spec is not None else None
    if spec is not None:
        _exit_codes_of_errors()
    chief = distributed.is_chief
    backend: Backend | None = None
    storage_fix: str | None = None  # what to change when the cluster's directory fails
    restore_roots: list[Path] = []
    recorded: dict[str, dict[str, str]] = {}
    if isinstance(spec, ClusterSpec):
        if spec.restore_from and spec.restore_sha256 is not None:
            recorded[PurePosixPath(spec.restore_from).name] = spec.restore_sha256
        if checkpoint_storage is not None:
            log.warning("checkpoint_storage= is ignored on a cluster: the experiment's is used")
        assert config is not None
        storage = trial_storage(config.checkpoint_storage, spec.checkpoint_root)
        if isinstance(storage, SharedFSStorage):
            storage_fix = cluster_storage_fix(config.checkpoint_storage.host_path)
            if chief:
                try:
                    check_writable(storage.root, storage_fix)
                except CheckpointError as e:  # a script may never store one
                    log.warning("%s; storing a checkpoint will fail", e)
        backend = ClusterBackend(spec) if chief else None
    else:
        storage, metrics_path = _local_storage(spec, checkpoint_storage)
        if isinstance(spec, LocalSpec) and spec.restore_dir:
            restore_roots.append(Path(spec.restore_dir))
        if chief:
            searcher = config.searcher if config is not None else None
            backend = LocalBackend(
                metrics_path,
                max_length=info.trial.max_length or None if info is not None else None,
                metric=searcher.metric if searcher is not None else None,
                smaller_is_better=searcher.smaller_is_better if searcher is not None else True,
                mark_dir=spec is None,
            )
    preempt = PreemptContext(
        distributed,
        backend,
        on_cluster=isinstance(spec, ClusterSpec),
        mode=preempt_mode,
    )
    search = _SearchState(
        backend,
        metric=config.searcher.metric if config is not None else None,
        time_metric=config.searcher.time_metric if config is not None else None,
        on_stop=preempt._searcher_stop,
    )
    trial_id = info.trial.trial_id if info is not None else 0
    tensorboard = TensorBoardFiles(storage, trial_id=trial_id, rank=distributed.rank)
    train = TrainContext(distributed, backend, search, tensorboard)
    checkpoint = CheckpointContext(
        distributed,
        backend,
        storage,
        trial_id=trial_id,
        hparams=info.trial.hparams if info is not None else {},
        steps=lambda: train._last_steps,
        restore_roots=restore_roots,
        after_store=tensorboard.sync,
        recorded=recorded,
        # a plain run's ./checkpoints (run-local marks its own when it makes it)
        mark_root=spec is None and checkpoint_storage is None,
        storage_fix=storage_fix,
    )
    unit = "batches"  # the master counts batches (epochs are converted)
    return Context(
        distributed=distributed,
        train=train,
        checkpoint=checkpoint,
        preempt=preempt,
        searcher=SearcherContext(search, distributed, unit),
        info=info,
        backend=backend,
        tensorboard=tensorboard,
        optimizations=config.optimizations if config is not None else None,
    )


def _local_storage(
    spec: LocalSpec | None, checkpoint_storage: str | os.PathLike[str] | dict[str, Any] | None
) -> tuple[StorageManager, Path]:
    """Checkpoint storage and metrics file of a run off the cluster."""
    if isinstance(checkpoint_storage, dict):
        from assay.config import parse_config

        data = {
            "entrypoint": "python3 -",
            "hyperparameters": {},
            "searcher": {"name": "single", "metric": "x", "max_length": {"batches": 1}},
            "checkpoint_storage": checkpoint_storage,
        }
        storage_config = parse_config(data).checkpoint_storage
        default = Path(DEFAULT_CHECKPOINT_DIR).resolve()
        storage = storage_for(storage_config, default)
    elif checkpoint_storage is not None:
        storage = SharedFSStorage(Path(checkpoint_storage).resolve())
    elif spec is not None:
        storage = SharedFSStorage(Path(spec.checkpoint_dir))
    else:
        storage = SharedFSStorage(Path(DEFAULT_CHECKPOINT_DIR).resolve())
    if spec is not None:
        return storage, Path(spec.metrics_path)
    return storage, Path(DEFAULT_METRICS_PATH).resolve()


__all__ = ["Context", "init"]
