"""One slot's process: build the Trial, restore, train, report.

Launched as `python -m assay._worker SPEC.json` with RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT set; `run_local` also calls `run_worker` in-process for one slot.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path

from assay._context import TrialContext
from assay._controller import TrialController
from assay._distributed import DistributedContext, default_device
from assay._loader import load_trial_class
from assay._local import LocalResult, WorkerSpec, seed_everything
from assay._precision import make_precision
from assay._session import LocalSession
from assay._trial import Trial
from assay.config import parse_config, sample_hparams
from assay.errors import AssayError

log = logging.getLogger("assay")


def run_worker(
    spec: WorkerSpec, *, trial_class: type[Trial] | None = None, env: Mapping[str, str] | None
) -> LocalResult | None:
    """Train this slot; rank 0 returns the result, the other ranks None."""
    config = parse_config(spec.config)
    distributed = DistributedContext.from_env(env)
    if distributed.size != config.resources.slots_per_trial:
        raise AssayError(
            f"WORLD_SIZE={distributed.size} but resources.slots_per_trial="
            f"{config.resources.slots_per_trial}"
        )
    if trial_class is None:
        if spec.model_dir is None:
            raise AssayError("a worker needs a model directory or a Trial class")
        trial_class = load_trial_class(spec.model_dir, config.entrypoint)
    device = default_device(distributed)
    distributed.init_process_group(device)
    seed = config.experiment_seed
    hparams = sample_hparams(config.hyperparameters, random.Random(seed))
    seed_everything(seed)
    precision = make_precision(config.optimizations.mixed_precision, device)
    context = TrialContext(
        config=config,
        hparams=hparams,
        distributed=distributed,
        device=device,
        precision=precision,
        trial_id=spec.trial_id,
        trial_seed=seed,
    )
    trial = trial_class(context)
    session = LocalSession(max_batches=0) if distributed.is_chief else None
    controller = TrialController(trial, context, session, Path(spec.checkpoint_dir), seed=seed)
    if session is not None:
        session.max_batches = config.searcher.max_length.to_batches(controller.batches_per_epoch)
    if spec.resume_from is not None:
        controller.restore(Path(spec.resume_from))
    result = controller.run()
    if session is None:
        return None
    return LocalResult(
        total_batches=result.total_batches,
        validation_metrics=result.validation_metrics,
        checkpoint=str(result.checkpoint) if result.checkpoint else None,
        hparams=hparams,
        training_history=[
            {"total_batches": r.total_batches, "epoch": r.epoch, "metrics": r.metrics}
            for r in session.training
        ],
        validation_history=[
            {"total_batches": r.total_batches, "epoch": r.epoch, "metrics": r.metrics}
            for r in session.validation
        ],
    )


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
        error_file.write_text(f"rank {rank}: {e}")
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception:
        traceback.print_exc()
        return 1
    if result is not None and result_path:
        tmp = Path(result_path + ".tmp")
        tmp.write_text(json.dumps(result.to_dict()))
        tmp.rename(result_path)
    import torch.distributed as dist

    if dist.is_initialized():
        # Leave together, then skip interpreter teardown: gloo's worker threads can abort
        # a process (SIGABRT, "terminate called") while Python finalises, after all the
        # work is done and saved.
        dist.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
