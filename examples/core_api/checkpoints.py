"""Core API, steps 2-4: checkpoints, preemption, hyperparameters and several processes.

Runs with `python3 checkpoints.py` anywhere; on a cluster or under `assay trial
run-local` it reads its hyperparameters and resumes from `latest_checkpoint`.
"""

import logging
import pathlib
import time

import assay
import assay.core


def save_state(x: int, steps_completed: int, trial_id: int, directory: pathlib.Path) -> None:
    with directory.joinpath("state").open("w") as f:
        f.write(f"{x},{steps_completed},{trial_id}")


def load_state(trial_id: int, directory: pathlib.Path) -> tuple[int, int]:
    with directory.joinpath("state").open("r") as f:
        x, steps_completed, ckpt_trial_id = (int(field) for field in f.read().split(","))
    if ckpt_trial_id == trial_id:
        return x, steps_completed
    return x, 0  # a checkpoint of another trial (a fork): keep the weights, restart counting


def main(
    core_context: assay.core.Context,
    latest_checkpoint: str | None,
    trial_id: int,
    increment_by: int,
    max_length: int,
) -> None:
    x = 0
    starting_batch = 0
    if latest_checkpoint is not None:
        with core_context.checkpoint.restore_path(latest_checkpoint) as path:
            x, starting_batch = load_state(trial_id, path)
        logging.info("resumed at step %d", starting_batch)
    for batch in range(starting_batch, max_length):
        x += increment_by
        steps_completed = batch + 1
        time.sleep(0.01)
        if steps_completed % 10 == 0:
            xs = core_context.distributed.gather(x)
            if core_context.distributed.rank == 0:
                assert xs is not None
                core_context.train.report_training_metrics(
                    steps_completed=steps_completed, metrics={"x": sum(xs)}
                )
                core_context.train.report_validation_metrics(
                    steps_completed=steps_completed,
                    metrics={"x": sum(xs), "batches": steps_completed},
                )
                with core_context.checkpoint.store_path({"steps_completed": steps_completed}) as (
                    path,
                    _uuid,
                ):
                    save_state(x, steps_completed, trial_id, path)
            if core_context.preempt.should_preempt():
                logging.info("stopping at step %d, to resume later", steps_completed)
                return


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    info = assay.get_cluster_info()
    if info is None:  # plain `python checkpoints.py`
        latest, trial_id, hparams, max_length = None, 0, {"increment_by": 1}, 100
    else:
        latest, trial_id = info.latest_checkpoint, info.trial.trial_id
        hparams, max_length = info.trial.hparams, info.trial.max_length
    with assay.core.init() as core_context:
        main(core_context, latest, trial_id, hparams["increment_by"], max_length)
