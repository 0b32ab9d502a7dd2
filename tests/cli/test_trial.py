"""`assay trial describe|logs|metrics` against a scripted master."""

from __future__ import annotations

import json

from assay.proto import api_pb2, common_pb2

from .conftest import FakeApi, assert_ok, assert_one_line_error, make_trial, run_cli


def test_describe_json(master: FakeApi) -> None:
    master.responses["GetTrial"] = make_trial(
        11, total_batches=64, best_validation=0.5, seed=99, restarts=2, latest_checkpoint="u-1"
    )

    done = run_cli("t", "describe", 11, "--json", master=master)

    assert_ok(done)
    trial = json.loads(done.stdout.strip().splitlines()[-1])
    assert trial["id"] == 11
    assert trial["experiment_id"] == 7
    assert trial["state"] == "RUNNING"
    assert trial["hparams"] == {"global_batch_size": 16, "lr": 0.05}
    assert (trial["total_batches"], trial["best_validation"], trial["restarts"]) == (64, 0.5, 2)
    assert trial["latest_checkpoint"] == "u-1"
    assert master.calls("GetTrial")[0].id == 11


def test_describe_human(master: FakeApi) -> None:
    master.responses["GetTrial"] = make_trial(11)

    done = run_cli("trial", "describe", 11, master=master)

    assert_ok(done)
    assert "RUNNING" in done.stdout
    assert "lr: 0.05" in done.stdout


def test_logs_print_rank_and_message(master: FakeApi) -> None:
    master.responses["StreamTrialLogs"] = [
        common_pb2.LogLine(id=1, trial_id=11, rank=0, message="loading data\n"),
        common_pb2.LogLine(id=2, trial_id=11, rank=1, message="epoch 1"),
    ]

    done = run_cli("t", "logs", 11, "-f", "--tail", 5, master=master)

    assert_ok(done)
    assert done.stdout == "[rank 0] loading data\n[rank 1] epoch 1\n"
    [request] = master.calls("StreamTrialLogs")
    assert (request.trial_id, request.follow, request.tail, request.after_id) == (11, True, 5, 0)


def test_logs_without_follow(master: FakeApi) -> None:
    master.responses["StreamTrialLogs"] = []

    done = run_cli("t", "logs", 11, master=master)

    assert_ok(done)
    assert done.stdout == ""
    [request] = master.calls("StreamTrialLogs")
    assert (request.follow, request.tail) == (False, 0)


def test_metrics_json_oldest_first(master: FakeApi) -> None:
    master.responses["GetTrialMetrics"] = api_pb2.GetTrialMetricsResponse(
        reports=[
            common_pb2.MetricsReport(total_batches=8, metrics={"val_loss": 0.5, "acc": 0.75}),
            common_pb2.MetricsReport(total_batches=16, metrics={"val_loss": 0.25, "acc": 0.875}),
        ]
    )

    done = run_cli("t", "metrics", 11, "--group", "validation", "--json", master=master)

    assert_ok(done)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [
        {"total_batches": 8, "metrics": {"acc": 0.75, "val_loss": 0.5}},
        {"total_batches": 16, "metrics": {"acc": 0.875, "val_loss": 0.25}},
    ]
    [request] = master.calls("GetTrialMetrics")
    assert (request.id, request.group) == (11, "validation")


def test_metrics_table(master: FakeApi) -> None:
    master.responses["GetTrialMetrics"] = api_pb2.GetTrialMetricsResponse(
        reports=[common_pb2.MetricsReport(total_batches=4, metrics={"loss": 1.5})]
    )

    done = run_cli("t", "metrics", 11, master=master)

    assert_ok(done)
    assert done.stdout.split() == ["BATCHES", "loss", "4", "1.5"]
    assert master.calls("GetTrialMetrics")[0].group == "training"


def test_unknown_trial(master: FakeApi) -> None:
    import grpc

    master.errors["GetTrial"] = (grpc.StatusCode.NOT_FOUND, "trial 99 not found")

    done = run_cli("t", "describe", 99, master=master)

    assert done.stderr == "error: trial 99 not found\n"
    assert_one_line_error(done)


def test_experiment_logs_prints_its_first_trials_logs(master: FakeApi) -> None:
    """Determined's `det e logs`: the first trial's, naming the others."""
    from .conftest import make_experiment

    master.responses["GetExperiment"] = api_pb2.GetExperimentResponse(
        experiment=make_experiment(7), trials=[make_trial(12), make_trial(11)]
    )
    master.responses["StreamTrialLogs"] = [
        common_pb2.LogLine(id=1, trial_id=11, rank=0, message="loading data\n"),
    ]

    done = run_cli("e", "logs", 7, "--tail", 3, master=master)

    assert_ok(done)
    assert done.stdout == "[rank 0] loading data\n"
    assert "experiment 7 has 2 trials: the logs of trial 11" in done.stderr
    assert "assay trial logs ID" in done.stderr
    [request] = master.calls("StreamTrialLogs")
    assert (request.trial_id, request.follow, request.tail) == (11, False, 3)
