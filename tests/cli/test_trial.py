"""`assay trial describe|logs|metrics` against a scripted master."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from assay.proto import api_pb2, common_pb2

from .conftest import TRACEBACK, FakeApi, assert_ok, assert_one_line_error, make_trial, run_cli


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


def test_logs_filters_go_to_the_master(master: FakeApi) -> None:
    master.responses["StreamTrialLogs"] = [common_pb2.LogLine(rank=2, message="loss nan")]
    before = dt.datetime.now(dt.UTC)

    done = run_cli(
        "t", "logs", 11, "--rank", 1, "--rank-id", 2, "--level", "warning", "--since", "1h30m",
        "--grep", "loss", "--head", 5, master=master,
    )  # fmt: skip
    absolute = run_cli(
        "t", "logs", 11, "--timestamp-after", "2026-01-02T15:04:05+02:00", master=master
    )

    assert_ok(done)
    assert done.stdout == "[rank 2] loss nan\n"
    first, second = master.calls("StreamTrialLogs")
    assert (list(first.ranks), first.min_level, first.search_text) == ([1, 2], "WARNING", "loss")
    assert (first.head, first.tail, first.follow) == (5, 0, False)
    since = dt.datetime.fromisoformat(first.since)
    assert first.since.endswith("Z")
    assert abs(since - (before - dt.timedelta(minutes=90))) < dt.timedelta(seconds=30)
    assert_ok(absolute)
    assert second.since == "2026-01-02T13:04:05Z"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--head", "3", "--tail", "2"), "--head cannot be combined with --tail or --follow"),
        (("--head", "3", "-f"), "--head cannot be combined with --tail or --follow"),
        (("--since", "last week"), "'last week' is neither a duration (90s, 10m, 1h30m, 2d)"),
        (("--level", "LOUD"), "'LOUD' is not one of 'trace', 'debug', 'info', 'warning'"),
        (("--rank", "-1"), "-1 is not in the range x>=0"),
    ],
)
def test_bad_log_filters_are_one_line_errors(
    master: FakeApi, args: tuple[str, ...], said: str
) -> None:
    done = run_cli("t", "logs", 11, *args, master=master)

    assert_one_line_error(done, said)
    assert master.calls("StreamTrialLogs") == []


class _Endless:
    """A follow that sends one line, then waits as a running trial's does."""

    def __init__(self) -> None:
        self.stop = threading.Event()

    def __call__(self, request: api_pb2.StreamTrialLogsRequest) -> Iterator[common_pb2.LogLine]:
        yield common_pb2.LogLine(rank=0, message="epoch 1")
        self.stop.wait(60)


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("command", [("trial", "logs", "11"), ("experiment", "logs", "7")])
def test_ctrl_c_on_a_follow_says_the_trial_goes_on(
    master: FakeApi, command: tuple[str, ...]
) -> None:
    endless = _Endless()
    master.responses["StreamTrialLogs"] = endless
    master.responses["GetExperiment"] = api_pb2.GetExperimentResponse(trials=[make_trial(11)])
    env = {k: v for k, v in os.environ.items() if k != "ASSAY_MASTER"}
    follow = subprocess.Popen(
        [sys.executable, "-m", "assay.cli.main", "-m", master.address, *command, "-f"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # As a terminal starts it: xdist's workers ignore SIGINT, and a Python started
        # with SIGINT ignored never raises KeyboardInterrupt.
        preexec_fn=_sigint_default,
    )
    try:
        assert follow.stdout is not None
        first = follow.stdout.readline()
        assert first == "[rank 0] epoch 1\n", follow.communicate(timeout=30)[1]
        follow.send_signal(signal.SIGINT)
        _, err = follow.communicate(timeout=30)
    finally:
        endless.stop.set()
        if follow.poll() is None:
            follow.kill()

    assert follow.returncode == 130
    assert TRACEBACK not in err
    assert err.strip().splitlines()[-1] == (
        "stopped following trial 11's logs; the trial goes on running (`assay trial logs 11 "
        "-f` follows it again, `assay trial kill 11` stops it)"
    )
    assert master.calls("KillTrial") == []
