"""What the CLI guide (docs/reference/cli.md) promises of every command, against a
scripted master: `--json` on every reading command, usage errors as one `error:` line,
help without arguments, the newest experiments first, progress that is 100% only when an
experiment COMPLETED, searched hyperparameters only, and metric groups named when one is
missing.
"""

from __future__ import annotations

import json

import click
import pytest

from assay.cli.main import cli
from assay.proto import api_pb2, common_pb2

from .conftest import (
    CONFIG,
    FakeApi,
    assert_ok,
    assert_one_line_error,
    experiment_response,
    make_experiment,
    make_trial,
    run_cli,
)

ACTIVE = common_pb2.EXPERIMENT_STATE_ACTIVE
COMPLETED = common_pb2.EXPERIMENT_STATE_COMPLETED
ERROR = common_pb2.EXPERIMENT_STATE_ERROR
CANCELED = common_pb2.EXPERIMENT_STATE_CANCELED

# Commands that only read: each takes --json. Writers and `run-local` print results.
READERS = {
    "experiment list",
    "experiment describe",
    "experiment list-trials",
    "experiment wait",
    "trial describe",
    "trial logs",
    "trial metrics",
    "agent list",
    "slot list",
    "checkpoint list",
    "master info",
    "preview-search",
    "user whoami",
    "user list",
    "usage",
}


def _commands(group: click.Group, prefix: str = "") -> dict[str, click.Command]:
    found: dict[str, click.Command] = {}
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        path = f"{prefix}{name}"
        if isinstance(command, click.Group):
            found.update(_commands(command, path + " "))
        else:
            found[path] = command
    return found


def test_every_reading_command_takes_json() -> None:
    commands = _commands(cli)
    assert set(commands) >= READERS, READERS - set(commands)
    missing = [
        path
        for path in sorted(READERS)
        if "--json" not in {opt for p in commands[path].params for opt in p.opts}
    ]
    assert missing == []


def test_no_arguments_prints_help_and_exits_0() -> None:
    done = run_cli()
    assert_ok(done)
    assert done.stdout.startswith("Usage: assay")
    assert "experiment (e)" in done.stdout
    group = run_cli("e")
    assert_ok(group)
    assert "Usage: assay e" in group.stdout
    assert "wait" in group.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["e", "create"], ["missing argument 'CONFIG'", "assay experiment create --help"]),
        (["frobnicate"], ["no such command 'frobnicate'", "assay --help"]),
        (["e", "list", "--limit", "0"], ["--limit", "0 is not in the range"]),
        (["e", "describe", "seven"], ["'seven' is not a valid integer"]),
        (["t", "logs", "3", "--bogus"], ["no such option", "--bogus"]),
        (["-m"], ["option '-m' requires an argument"]),
    ],
)
def test_usage_errors_are_one_error_line_and_exit_1(args: list[str], words: list[str]) -> None:
    done = run_cli(*args)

    assert_one_line_error(done, *words)
    assert "Usage:" not in done.stderr


def test_trial_logs_json_is_one_object_per_line(master: FakeApi) -> None:
    master.responses["StreamTrialLogs"] = [
        common_pb2.LogLine(id=1, trial_id=3, rank=0, stream="stdout", message="hello\n"),
        common_pb2.LogLine(id=2, trial_id=3, rank=1, stream="stderr", level="WARNING", message="x"),
    ]

    done = run_cli("t", "logs", 3, "--json", master=master)

    assert_ok(done)
    lines = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert [(d["id"], d["rank"], d["stream"], d["message"]) for d in lines] == [
        (1, 0, "stdout", "hello"),
        (2, 1, "stderr", "x"),
    ]
    assert (lines[0]["level"], lines[1]["level"]) == (None, "WARNING")


def test_list_limit_asks_for_the_newest_and_shows_them_oldest_first(master: FakeApi) -> None:
    master.responses["ListExperiments"] = api_pb2.ListExperimentsResponse(
        experiments=[make_experiment(9), make_experiment(8)], total=9
    )

    done = run_cli("e", "list", "--limit", 2, master=master)

    assert_ok(done)
    [request] = master.calls("ListExperiments")
    assert (request.limit, request.sort_by, request.ascending) == (2, "id", False)
    rows = done.stdout.strip().splitlines()
    assert [r.split()[0] for r in rows[1:3]] == ["8", "9"]
    assert rows[-1] == "(the newest 2 of 9; --limit N shows more)"
    as_json = run_cli("e", "list", "--limit", 2, "--json", master=master)
    assert [e["id"] for e in json.loads(as_json.stdout.strip().splitlines()[-1])] == [8, 9]


def test_progress_is_100_percent_only_when_completed(master: FakeApi) -> None:
    master.responses["ListExperiments"] = api_pb2.ListExperimentsResponse(
        experiments=[
            make_experiment(1, ERROR, progress=1.0),
            make_experiment(2, CANCELED, progress=1.0),
            make_experiment(3, COMPLETED, progress=1.0),
            make_experiment(4, CANCELED, progress=0.25),
        ],
        total=4,
    )

    done = run_cli("e", "list", master=master)

    assert_ok(done)
    progress = {row.split()[0]: row.split()[3] for row in done.stdout.splitlines()[1:]}
    assert progress == {"1": "99%", "2": "99%", "3": "100%", "4": "25%"}


def test_hparams_column_shows_searched_values_with_4_significant_digits(
    master: FakeApi,
) -> None:
    config = dict(
        CONFIG,
        hyperparameters={
            "global_batch_size": 16,
            "dropout": {"type": "const", "val": 0.5},
            "lr": {"type": "log", "minval": -4, "maxval": -1},
            "model": {"width": {"type": "int", "minval": 8, "maxval": 64}, "depth": 3},
        },
    )
    hparams = {
        "global_batch_size": 16,
        "dropout": 0.5,
        "lr": 0.000123456789,
        "model": {"width": 37, "depth": 3},
    }
    master.responses["GetExperiment"] = api_pb2.GetExperimentResponse(
        experiment=make_experiment(config=config), trials=[make_trial(11, hparams=hparams)]
    )

    done = run_cli("e", "list-trials", 7, master=master)

    assert_ok(done)
    assert done.stdout.strip().splitlines()[-1].endswith("lr=0.0001235 model.width=37")
    for constant in ("global_batch_size", "dropout", "depth"):
        assert constant not in done.stdout


def _metrics_master(master: FakeApi, groups: dict[str, int]) -> None:
    """Trial 11 of experiment 7 with `groups`: name -> number of reports."""
    master.responses["GetTrial"] = make_trial(11)
    master.responses["GetExperiment"] = api_pb2.GetExperimentResponse(
        experiment=make_experiment(),
        metric_names=[api_pb2.MetricName(group=g, name="loss") for g in groups],
    )

    def metrics(request: api_pb2.GetTrialMetricsRequest) -> api_pb2.GetTrialMetricsResponse:
        # The master's rule (store.metric_series): 0 (all), or 2 to 100,000 points.
        assert request.max_points == 0 or 2 <= request.max_points <= 100_000, request
        count = groups.get(request.group, 0)
        return api_pb2.GetTrialMetricsResponse(
            reports=[
                common_pb2.MetricsReport(total_batches=8 * (i + 1), metrics={"loss": 0.5})
                for i in range(count)
            ]
        )

    master.responses["GetTrialMetrics"] = metrics


def test_metrics_of_a_group_the_trial_lacks_names_its_groups(master: FakeApi) -> None:
    _metrics_master(master, {"training": 3, "validation": 1, "inference": 0})

    done = run_cli("t", "metrics", 11, "--group", "valdiation", master=master)

    line = assert_one_line_error(done, "trial 11 has no 'valdiation' metrics")
    assert line.endswith("its groups are: training, validation")


def test_validation_metrics_of_a_trial_that_only_trained_name_its_groups(
    master: FakeApi,
) -> None:
    # It asked the master for 1 point of each other group, which the master refuses:
    # "error: max_points must be 2-100000, got 1".
    _metrics_master(master, {"training": 3})

    done = run_cli("t", "metrics", 11, "--group", "validation", master=master)

    line = assert_one_line_error(done, "trial 11 has no 'validation' metrics")
    assert line.endswith("its groups are: training")


def test_metrics_of_a_known_group_not_yet_reported_is_empty(master: FakeApi) -> None:
    _metrics_master(master, {})

    done = run_cli("t", "metrics", 11, "--group", "validation", "--json", master=master)

    assert_ok(done)
    assert json.loads(done.stdout.strip()) == []
    custom = run_cli("t", "metrics", 11, "--group", "inference", master=master)
    assert_one_line_error(custom, "trial 11 has no 'inference' metrics; it has reported none yet")


def test_metrics_of_a_group_with_reports_needs_no_extra_calls(master: FakeApi) -> None:
    _metrics_master(master, {"training": 2})

    done = run_cli("t", "metrics", 11, "--json", master=master)

    assert_ok(done)
    assert [r["total_batches"] for r in json.loads(done.stdout)] == [8, 16]
    assert master.calls("GetExperiment") == []


def test_describe_help_says_what_it_prints(master: FakeApi) -> None:
    master.responses["GetExperiment"] = experiment_response(ACTIVE, [make_trial(11)])

    helped = run_cli("e", "describe", "--help")
    human = run_cli("e", "describe", 7, master=master)
    as_json = run_cli("e", "describe", 7, "--json", master=master)

    assert_ok(helped)
    text = " ".join(helped.stdout.split())
    assert "a table of its trials" in text
    assert "--json adds its config" in text
    assert "HPARAMS" in human.stdout
    assert "searcher:" not in human.stdout
    assert "config" in json.loads(as_json.stdout)
