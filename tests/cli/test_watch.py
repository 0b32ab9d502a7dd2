"""`experiment wait` and `create --follow` against a scripted master: progress lines,
`--quiet`, the summary line, and log lines that arrive after a trial has ended."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from assay.proto import api_pb2, common_pb2

from .conftest import (
    FakeApi,
    assert_ok,
    assert_one_line_error,
    make_experiment,
    make_trial,
    run_cli,
)

ACTIVE = common_pb2.EXPERIMENT_STATE_ACTIVE
COMPLETED = common_pb2.EXPERIMENT_STATE_COMPLETED
ERROR = common_pb2.EXPERIMENT_STATE_ERROR
T_QUEUED = common_pb2.TRIAL_STATE_QUEUED
T_RUNNING = common_pb2.TRIAL_STATE_RUNNING
T_DONE = common_pb2.TRIAL_STATE_COMPLETED
T_ERROR = common_pb2.TRIAL_STATE_ERROR


def response(state: int, trials: list[common_pb2.Trial]) -> api_pb2.GetExperimentResponse:
    progress = 1.0 if state == COMPLETED else 0.5
    return api_pb2.GetExperimentResponse(
        experiment=make_experiment(state=state, progress=progress), trials=trials
    )


def search(master: FakeApi) -> None:
    """Two trials: queued, then running, then one done (val_loss 0.25), then both."""
    answers = iter(
        [
            response(ACTIVE, [make_trial(1, T_RUNNING), make_trial(2, T_QUEUED)]),
            response(ACTIVE, [make_trial(1, T_RUNNING), make_trial(2, T_RUNNING)]),
            response(
                ACTIVE,
                [make_trial(1, T_DONE, best_validation=0.25), make_trial(2, T_RUNNING)],
            ),
            response(
                COMPLETED,
                [
                    make_trial(1, T_DONE, best_validation=0.25, total_batches=8),
                    make_trial(2, T_DONE, best_validation=0.5, total_batches=8),
                ],
            ),
        ]
    )
    master.responses["GetExperiment"] = lambda _: next(answers)

    def checkpoint(uuid: str, batches: int, loss: float, state: int) -> common_pb2.Checkpoint:
        return common_pb2.Checkpoint(
            uuid=uuid,
            trial_id=1,
            total_batches=batches,
            state=state,  # type: ignore[arg-type]
            validation_metrics={"val_loss": loss},
        )

    master.responses["ListCheckpoints"] = api_pb2.ListCheckpointsResponse(
        checkpoints=[
            checkpoint("ckpt-latest", 8, 0.3, common_pb2.CHECKPOINT_STATE_COMPLETED),
            checkpoint("ckpt-best", 4, 0.25, common_pb2.CHECKPOINT_STATE_COMPLETED),
            checkpoint("ckpt-deleted", 2, 0.1, common_pb2.CHECKPOINT_STATE_DELETED),
        ]
    )


SUMMARY = "experiment 7 COMPLETED: best val_loss 0.25 (trial 1), checkpoint ckpt-best"


def test_wait_prints_progress_then_a_summary(master: FakeApi) -> None:
    search(master)

    done = run_cli("e", "wait", 7, master=master)

    assert_ok(done)
    lines = done.stdout.strip().splitlines()
    assert lines == [
        "experiment 7: 50%; trials: 0 done, 1 running, 1 queued",
        "experiment 7: 50%; trials: 0 done, 2 running, 0 queued",
        "experiment 7: 50%; trials: 1 done, 1 running, 0 queued; best val_loss 0.25 (trial 1)",
        SUMMARY,
    ]
    [request] = master.calls("ListCheckpoints")
    assert (request.experiment_id, request.trial_id) == (7, 1)


def test_progress_lines_are_throttled(master: FakeApi) -> None:
    search(master)

    done = run_cli("e", "wait", 7, master=master, env={"ASSAY_PROGRESS_SECONDS": "60"})

    assert_ok(done)
    assert done.stdout.strip().splitlines() == [
        "experiment 7: 50%; trials: 0 done, 1 running, 1 queued",
        SUMMARY,
    ]


def test_wait_quiet_prints_only_the_summary(master: FakeApi) -> None:
    search(master)

    done = run_cli("e", "wait", 7, "--quiet", master=master)

    assert_ok(done)
    assert done.stdout.strip().splitlines() == [SUMMARY]


def test_wait_json_summary(master: FakeApi) -> None:
    search(master)

    done = run_cli("e", "wait", 7, "--json", master=master)

    assert_ok(done)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "id": 7,
        "state": "COMPLETED",
        "metric": "val_loss",
        "best_validation": 0.25,
        "best_trial": 1,
        "best_checkpoint": "ckpt-best",
        "best_checkpoint_validation": 0.25,
        "errors": {},
    }
    assert "50%" in done.stderr  # the progress, for people, on stderr


def test_the_summary_says_when_no_checkpoint_holds_the_best_validation(master: FakeApi) -> None:
    """The best val_loss came at a step without a checkpoint: the line names the best
    checkpoint there is and its own value, not as if it held the best one."""
    search(master)
    later = master.responses["ListCheckpoints"]
    master.responses["ListCheckpoints"] = api_pb2.ListCheckpointsResponse(
        checkpoints=[c for c in later.checkpoints if c.uuid == "ckpt-latest"]
    )

    done = run_cli("e", "wait", 7, "--quiet", master=master)

    assert_ok(done)
    assert done.stdout.strip() == (
        "experiment 7 COMPLETED: best val_loss 0.25 (trial 1), checkpoint ckpt-latest (its "
        "val_loss 0.3: no checkpoint was taken at the best validation)"
    )


def test_wait_error_summary_names_the_failure(master: FakeApi) -> None:
    failed = make_trial(3, T_ERROR, total_batches=2, restarts=0, last_error="ImportError: x\n")
    master.responses["GetExperiment"] = response(ERROR, [failed])

    done = run_cli("e", "wait", 7, master=master)

    assert done.stdout.strip() == (
        "experiment 7 ERROR: no validation val_loss reported; trial 3 failed: ImportError: x"
    )
    assert_one_line_error(done, "experiment 7 ended in state ERROR")


def test_follow_prints_logs_that_arrive_after_the_trial_ended(
    master: FakeApi, config_file: Path, model_dir: Path
) -> None:
    master.responses["CreateExperiment"] = api_pb2.CreateExperimentResponse(
        experiment=make_experiment(7)
    )
    polls = {"n": 0}

    def get_experiment(_: api_pb2.GetExperimentRequest) -> api_pb2.GetExperimentResponse:
        polls["n"] += 1
        if polls["n"] == 1:
            return response(ACTIVE, [make_trial(11, T_RUNNING)])
        trial = make_trial(11, T_DONE, total_batches=8, best_validation=0.5)
        return response(COMPLETED, [trial])

    def logs(request: api_pb2.StreamTrialLogsRequest) -> Iterator[common_pb2.LogLine]:
        # The last line reaches the master after the trial's end was seen: only the
        # third request (the one made once the experiment has ended) finds it.
        polls["logs"] = polls.get("logs", 0) + 1
        shown = 1 if polls["logs"] < 3 else 2
        lines = [
            common_pb2.LogLine(id=1, trial_id=11, message="batch 0: train to batch 8"),
            common_pb2.LogLine(id=2, trial_id=11, message="batch 8: the master says stop"),
        ]
        return iter([line for line in lines[:shown] if line.id > request.after_id])

    master.responses["GetExperiment"] = get_experiment
    master.responses["StreamTrialLogs"] = logs
    master.responses["ListCheckpoints"] = api_pb2.ListCheckpointsResponse()

    done = run_cli("e", "create", config_file, model_dir, "--follow", master=master)

    assert_ok(done)
    lines = done.stdout.strip().splitlines()
    assert lines[-3:] == [
        "trial 11: COMPLETED at batch 8 (best val_loss 0.5)",
        "[trial 11 rank 0] batch 8: the master says stop",
        "experiment 7 COMPLETED: best val_loss 0.5 (trial 11), checkpoint -",
    ]
    assert len(master.calls("StreamTrialLogs")) == 3
    assert lines.count("[trial 11 rank 0] batch 0: train to batch 8") == 1


def test_follow_quiet_prints_no_logs(master: FakeApi, config_file: Path, model_dir: Path) -> None:
    master.responses["CreateExperiment"] = api_pb2.CreateExperimentResponse(
        experiment=make_experiment(7)
    )
    master.responses["GetExperiment"] = response(COMPLETED, [make_trial(11, T_DONE)])

    done = run_cli("e", "create", config_file, model_dir, "-f", "-q", master=master)

    assert_ok(done)
    assert done.stdout.strip().splitlines() == [
        "Created experiment 7",
        "experiment 7 COMPLETED: no validation val_loss reported",
    ]
    assert master.calls("StreamTrialLogs") == []
