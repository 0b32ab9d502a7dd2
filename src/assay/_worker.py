"""One slot's process: build the Trial, restore, train, report.

Launched as `python -m assay._worker SPEC.json` with RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT set; `run_local` also calls `run_worker` in-process for one slot.
On a cluster, `python -m assay._cluster` calls `run_worker` with a session factory that
reports to the master instead of keeping the reports in a `LocalSession`.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from assay._banner import local_hparams
from assay._context import TrialContext
from assay._controller import RunResult, TrialController
from assay._distributed import DistributedContext, default_device
from assay._loader import load_trial_class
from assay._precision import make_precision
from assay._preempt import POLL_INTERVAL_S, PreemptWatcher
from assay._rank_metrics import GROUP as RANK_GROUP
from assay._session import LocalSession, Session
from assay._trial import Trial, construct_trial
from assay.common.spec import LocalResult, WorkerSpec
from assay.common.storage import StorageManager
from assay.config import ExperimentConfig, Length, parse_config
from assay.errors import AssayError, PermanentError, TrainingError, TrialContractError

log = logging.getLogger("assay")


SessionFactory = Callable[[ExperimentConfig], Session]
"""Builds rank 0's session (called on rank 0 only, before the Trial is constructed)."""


def run_worker(
    spec: WorkerSpec,
    *,
    trial_class: type[Trial] | None = None,
    env: Mapping[str, str] | None,
    session_factory: SessionFactory | None = None,
    storage: StorageManager | None = None,
) -> LocalResult | None:
    """Train this slot; rank 0 returns the result, the other ranks None.

    Without `session_factory`, rank 0 trains one target of `searcher.max_length` under a
    `LocalSession` and the result carries its metric history; with one, the session it
    returns decides the targets and receives the reports (the history is then empty).
    `spec.hparams` / `spec.trial_seed`, when given, replace the hyperparameters sampled
    from `reproducibility.experiment_seed` and that seed. `storage`: object storage that
    every rank uploads its own shards of a sharded checkpoint to (`TrialController`).
    """
    config = parse_config(spec.config)
    if trial_class is None:
        if spec.model_dir is None:
            raise AssayError("a worker needs a model directory or a Trial class")
        trial_class = load_trial_class(spec.model_dir, config.entrypoint)
    # Sampled as run-local's first line announced them, unless the spec gives them.
    hparams = local_hparams(config) if spec.hparams is None else dict(spec.hparams)
    seed = config.experiment_seed if spec.trial_seed is None else spec.trial_seed
    context = build_context(
        config, env=env, hparams=hparams, trial_seed=seed, trial_id=spec.trial_id
    )
    trial = construct(trial_class, context)
    session: Session | None = None
    local: LocalSession | None = None
    if context.distributed.is_chief:
        if session_factory is None:
            session = local = LocalSession(max_batches=0)
        else:
            session = session_factory(config)
    # On a cluster, SIGTERM or the master's word stops training at a checkpoint (exit 0).
    preempt = preempt_watcher(session, env) if session_factory is not None else None
    result = train_slot(
        trial,
        context,
        session,
        Path(spec.checkpoint_dir),
        resume_from=spec.resume_from,
        resume_sha256=spec.resume_sha256,
        preempt=preempt,
        max_length=config.searcher.trial_length if local is not None else None,
        storage=storage,
    )
    if session is None:
        return None
    return local_result(result, session, hparams)


# What constructing a Trial raises the same way on every run: the Trial's contract broken
# (TrainingError), a hyperparameter of the wrong type or name (TypeError, KeyError), a
# programming error. Anything else (an OSError reading data, a CUDA error) may pass.
REPEATABLE_CONSTRUCTION_ERRORS = (
    TrainingError,
    TypeError,
    KeyError,
    AttributeError,
    NameError,
    ImportError,
    SyntaxError,
)


def construct(trial_class: type[Trial], context: TrialContext) -> Trial:
    """`construct_trial`, with a failure that would recur on every run raised as a
    `PermanentError` that names the user's frame (the original is its `__cause__`)."""
    from assay._user_frame import describe

    try:
        return construct_trial(trial_class, context)
    except REPEATABLE_CONSTRUCTION_ERRORS as e:
        if isinstance(e, TrainingError):
            raise TrialContractError(str(e)) from e
        raise PermanentError(
            f"constructing {trial_class.__qualname__} failed: {describe(e)}"
        ) from e


def build_context(
    config: ExperimentConfig,
    *,
    env: Mapping[str, str] | None,
    hparams: Mapping[str, Any],
    trial_seed: int,
    trial_id: int = 0,
    experiment_id: int = 0,
    distributed: DistributedContext | None = None,
) -> TrialContext:
    """This slot's `TrialContext`: joins the process group (WORLD_SIZE > 1), seeds every
    RNG with `trial_seed` and picks the device and precision plugin."""
    if distributed is None:
        distributed = DistributedContext.from_env(env)
    if distributed.size != config.resources.slots_per_trial:
        raise AssayError(
            f"WORLD_SIZE={distributed.size} but resources.slots_per_trial="
            f"{config.resources.slots_per_trial}"
        )
    device = default_device(distributed)
    distributed.init_process_group(device)
    seed_everything(trial_seed)
    precision = make_precision(config.optimizations.mixed_precision, device)
    return TrialContext(
        config=config,
        hparams=hparams,
        distributed=distributed,
        device=device,
        precision=precision,
        trial_id=trial_id,
        trial_seed=trial_seed,
        experiment_id=experiment_id,
    )


def preempt_watcher(session: Session | None, env: Mapping[str, str] | None) -> PreemptWatcher:
    """Watches SIGTERM, and on rank 0 polls `session.preempt_requested`."""
    ask = session.preempt_requested if session is not None else None
    interval = float((env or os.environ).get("ASSAY_PREEMPT_POLL_S", POLL_INTERVAL_S))
    return PreemptWatcher(ask, interval)


def train_slot(
    trial: Trial,
    context: TrialContext,
    session: Session | None,
    checkpoint_dir: Path,
    *,
    resume_from: str | Path | None = None,
    resume_sha256: Mapping[str, str] | None = None,
    preempt: PreemptWatcher | None = None,
    max_length: Length | None = None,
    metric_required: bool = True,
    storage: StorageManager | None = None,
) -> RunResult:
    """Restore `resume_from` if given (verified against `resume_sha256`, the master's record
    of its files, when given) and run the trial controller on this slot.

    `max_length`: with a `LocalSession`, the length it trains to (epochs are counted with
    the training loader's length). The preemption watcher is closed at the end.
    """
    try:
        controller = TrialController(
            trial,
            context,
            session,
            checkpoint_dir,
            seed=context.get_trial_seed(),
            preempt=preempt,
            metric_required=metric_required,
            storage=storage,
        )
        if isinstance(session, LocalSession) and max_length is not None:
            session.max_batches = max_length.to_batches(controller.batches_per_epoch)
        if resume_from is not None:
            controller.restore(Path(resume_from), resume_sha256)
        return controller.run()
    finally:
        if preempt is not None:
            preempt.close()


def local_result(result: RunResult, session: Session, hparams: Mapping[str, Any]) -> LocalResult:
    """Rank 0's `LocalResult` (with the metric history when `session` kept one)."""
    history = session if isinstance(session, LocalSession) else LocalSession(0, echo=False)
    return LocalResult(
        total_batches=result.total_batches,
        validation_metrics=result.validation_metrics,
        checkpoint=str(result.checkpoint) if result.checkpoint else None,
        hparams=dict(hparams),
        training_history=[
            {"total_batches": r.total_batches, "epoch": r.epoch, "metrics": r.metrics}
            for r in history.training
        ],
        validation_history=[
            {"total_batches": r.total_batches, "epoch": r.epoch, "metrics": r.metrics}
            for r in history.validation
        ],
        system_history=[
            {"total_batches": r.total_batches, "epoch": r.epoch, "metrics": r.metrics}
            for r in history.groups.get(RANK_GROUP, [])
        ],
    )


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    spec_path = Path(argv[0])
    data = json.loads(spec_path.read_text())
    result_path = data.pop("result_path", None)
    spec = WorkerSpec(**data)
    rank = os.environ.get("RANK", "0")
    error_file = spec_path.parent / f"error-{rank}.txt"
    try:
        result = run_worker(spec, env=None)
    except AssayError as e:
        if e.__cause__ is not None and show_tracebacks():
            traceback.print_exception(e.__cause__)
        error_file.write_text(f"rank {rank}: {e}")
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        from assay._user_frame import describe, user_frame

        # The launcher ends with this one line; the whole traceback on request, or when
        # the error is not in the user's code (then it is Assay's to fix).
        if show_tracebacks() or user_frame(e) is None:
            traceback.print_exc()
        error_file.write_text(f"rank {rank}: {describe(e)}")
        return 1
    if result is not None and result_path:
        tmp = Path(result_path + ".tmp")
        tmp.write_text(json.dumps(result.to_dict()))
        tmp.rename(result_path)
    leave_process_group()
    return 0


TRACEBACK_ENV = "ASSAY_TRACEBACK"


def show_tracebacks(env: Mapping[str, str] | None = None) -> bool:
    """Whether a local run prints whole tracebacks (`run-local --verbose` sets
    ASSAY_TRACEBACK=1) rather than the one line naming the user's frame."""
    return (os.environ if env is None else env).get(TRACEBACK_ENV, "") not in ("", "0")


def leave_process_group(code: int = 0) -> None:
    """After a run: wait for every rank, then exit `code` without interpreter teardown.

    Returns (and the caller exits normally) when there is no process group.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        # Leave together, then skip interpreter teardown: gloo's worker threads can abort
        # a process (SIGABRT, "terminate called") while Python finalises, after all the
        # work is done and saved.
        dist.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
