"""`assay experiment ...` against a scripted master."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from click.testing import CliRunner

from assay.cli.main import cli
from assay.common.archive import unpack_model_dir
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


def created(experiment_id: int = 7) -> api_pb2.CreateExperimentResponse:
    return api_pb2.CreateExperimentResponse(experiment=make_experiment(experiment_id))


def test_create_uploads_config_text_and_model_archive(
    master: FakeApi, config_file: Path, model_dir: Path, tmp_path: Path
) -> None:
    master.responses["CreateExperiment"] = created(42)

    done = run_cli("e", "create", config_file, model_dir, "--json", master=master)

    assert_ok(done)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"id": 42}
    [request] = master.calls("CreateExperiment")
    assert request.config_yaml == config_file.read_text()
    assert request.activate is True
    with tarfile.open(fileobj=io.BytesIO(request.model_definition), mode="r:gz") as tar:
        assert "model_def.py" in tar.getnames()
    unpack_model_dir(request.model_definition, tmp_path / "unpacked")
    assert (tmp_path / "unpacked" / "model_def.py").read_bytes() == (
        model_dir / "model_def.py"
    ).read_bytes()


def test_create_paused_and_human_output(
    master: FakeApi, config_file: Path, model_dir: Path
) -> None:
    master.responses["CreateExperiment"] = created(5)

    done = run_cli("experiment", "create", config_file, model_dir, "--paused", master=master)

    assert_ok(done)
    assert "Created experiment 5" in done.stdout
    assert master.calls("CreateExperiment")[0].activate is False


def test_create_invalid_config_refused_locally(
    master: FakeApi, tmp_path: Path, model_dir: Path
) -> None:
    bad = dict(CONFIG, searcher={"name": "single", "metric": "val_loss"})
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(bad))

    done = run_cli("e", "create", config, model_dir, master=master)

    assert done.returncode == 1
    assert done.stderr.startswith("error: invalid experiment config:")
    assert "searcher.max_length" in done.stderr
    assert "Traceback" not in done.stderr
    assert master.requests == []


def test_create_missing_model_dir(master: FakeApi, config_file: Path, tmp_path: Path) -> None:
    done = run_cli("e", "create", config_file, tmp_path / "nope", master=master)

    assert_one_line_error(done, "nope", "does not exist")
    assert master.requests == []


def test_create_names_a_missing_script_before_uploading(
    master: FakeApi, tmp_path: Path, model_dir: Path
) -> None:
    config = tmp_path / "script.yaml"
    config.write_text(yaml.safe_dump(dict(CONFIG, entrypoint="python3 trian.py")))

    done = run_cli("e", "create", config, model_dir, master=master)

    assert_one_line_error(done, "trian.py", "not in the model directory")
    assert master.requests == []


def test_create_rejected_by_master_prints_its_details(
    master: FakeApi, config_file: Path, model_dir: Path
) -> None:
    master.errors["CreateExperiment"] = (
        grpc.StatusCode.INVALID_ARGUMENT,
        "resources.slots_per_trial: 64 slots requested, the cluster has 8",
    )

    done = run_cli("e", "create", config_file, model_dir, master=master)

    assert_one_line_error(done, "resources.slots_per_trial: 64 slots requested")


def scripted_run(final: int) -> tuple[Any, Any]:
    """GetExperiment answers ACTIVE twice (trial queued, then running), then `final`."""
    polls = {"n": 0}

    def get_experiment(request: api_pb2.GetExperimentRequest) -> api_pb2.GetExperimentResponse:
        polls["n"] += 1
        n = polls["n"]
        if n == 1:
            return experiment_response(ACTIVE, [make_trial(11, common_pb2.TRIAL_STATE_QUEUED)])
        if n == 2:
            return experiment_response(ACTIVE, [make_trial(11, common_pb2.TRIAL_STATE_RUNNING)])
        trial_state = (
            common_pb2.TRIAL_STATE_COMPLETED if final == COMPLETED else common_pb2.TRIAL_STATE_ERROR
        )
        return experiment_response(final, [make_trial(11, trial_state)])

    lines = [
        common_pb2.LogLine(id=i, trial_id=11, rank=i % 2, message=f"step {i}\n")
        for i in range(1, 5)
    ]

    def logs(request: api_pb2.StreamTrialLogsRequest) -> Iterator[common_pb2.LogLine]:
        assert not request.follow
        return iter([line for line in lines if line.id > request.after_id][:2])

    return get_experiment, logs


def test_create_follow_streams_states_and_logs(
    master: FakeApi, config_file: Path, model_dir: Path
) -> None:
    master.responses["CreateExperiment"] = created(7)
    master.responses["GetExperiment"], master.responses["StreamTrialLogs"] = scripted_run(COMPLETED)

    done = run_cli("e", "create", config_file, model_dir, "-f", master=master)

    assert_ok(done)
    out = done.stdout
    assert "trial 11: QUEUED" in out
    assert "trial 11: RUNNING" in out
    for i in range(1, 5):
        assert out.count(f"[trial 11 rank {i % 2}] step {i}\n") == 1
    # Every log line comes before the trial's end, and the trial's end before the summary.
    lines = out.strip().splitlines()
    assert lines.index("trial 11: COMPLETED at batch 0") > lines.index("[trial 11 rank 0] step 4")
    assert lines[-1] == "experiment 7 COMPLETED: no validation val_loss reported"
    after_ids = [r.after_id for r in master.calls("StreamTrialLogs")]
    assert after_ids[:3] == [0, 2, 4]


def test_create_follow_fails_unless_completed(
    master: FakeApi, config_file: Path, model_dir: Path
) -> None:
    master.responses["CreateExperiment"] = created(7)
    master.responses["GetExperiment"], master.responses["StreamTrialLogs"] = scripted_run(
        common_pb2.EXPERIMENT_STATE_ERROR
    )

    done = run_cli("e", "create", config_file, model_dir, "--follow", "--json", master=master)

    assert done.returncode == 1
    first, last = done.stdout.strip().splitlines()  # progress went to stderr
    assert json.loads(first) == {"id": 7}
    assert json.loads(last)["state"] == "ERROR"
    assert json.loads(last)["id"] == 7
    assert "trial 11: ERROR" in done.stderr
    assert done.stderr.strip().splitlines()[-1] == "error: experiment 7 ended in state ERROR"


def test_list_json_and_filters(master: FakeApi) -> None:
    master.responses["ListExperiments"] = api_pb2.ListExperimentsResponse(
        experiments=[
            make_experiment(1, COMPLETED, labels=["a"], best_validation=0.25, num_trials=3),
            make_experiment(2, ACTIVE, name="other", progress=0.5),
        ],
        total=2,
    )

    done = run_cli(
        "e", "list", "--state", "active", "--state", "COMPLETED", "--name", "reg",
        "--label", "a", "--json", master=master,
    )  # fmt: skip

    assert_ok(done)
    listed = json.loads(done.stdout.strip().splitlines()[-1])
    assert [e["id"] for e in listed] == [1, 2]
    assert listed[0]["state"] == "COMPLETED"
    assert listed[0]["best_validation"] == 0.25
    assert listed[0]["labels"] == ["a"]
    assert listed[1]["best_validation"] is None
    assert listed[1]["progress"] == 0.5
    [request] = master.calls("ListExperiments")
    assert list(request.states) == [ACTIVE, COMPLETED]
    assert (request.name, request.label) == ("reg", "a")
    assert request.HasField("archived")
    assert request.archived is False


def test_list_all_includes_archived_and_prints_a_table(master: FakeApi) -> None:
    master.responses["ListExperiments"] = api_pb2.ListExperimentsResponse(
        experiments=[make_experiment(1, COMPLETED, archived=True)], total=1
    )

    done = run_cli("e", "list", "--all", master=master)

    assert_ok(done)
    header, row = done.stdout.strip().splitlines()
    assert header.split()[:3] == ["ID", "NAME", "STATE"]
    assert row.split()[:3] == ["1", "regression", "COMPLETED"]
    assert header.index("STATE") == row.index("COMPLETED")
    assert not master.calls("ListExperiments")[0].HasField("archived")


def test_describe_json_shape(master: FakeApi) -> None:
    master.responses["GetExperiment"] = experiment_response(
        ACTIVE,
        [
            make_trial(
                11,
                common_pb2.TRIAL_STATE_COMPLETED,
                total_batches=8,
                best_validation=0.125,
                latest_checkpoint="abc-123",
                restarts=1,
            ),
            make_trial(12, common_pb2.TRIAL_STATE_QUEUED, hparams={"lr": 0.1, "layers": 3}),
        ],
    )

    master.responses["GetExperiment"].slot_seconds = 7200.0

    done = run_cli("e", "describe", 7, "--json", master=master)

    assert_ok(done)
    described = json.loads(done.stdout.strip().splitlines()[-1])
    assert described == {
        "id": 7,
        "name": "regression",
        "state": "ACTIVE",
        "searcher": "single",
        "progress": 0.0,
        "seed": 0,  # an experiment stored before the master drew seeds
        "config": CONFIG,
        "best_trial": {"id": 11, "best_validation": 0.125},
        "slot_hours": 2.0,
        "trials": [
            {
                "id": 11,
                "state": "COMPLETED",
                "hparams": {"global_batch_size": 16, "lr": 0.05},
                "total_batches": 8,
                "best_validation": 0.125,
                "latest_checkpoint": "abc-123",
                "restarts": 1,
                "last_error": None,
                "waiting": None,
                "parent_trial_id": None,
                "search_round": None,
            },
            {
                "id": 12,
                "state": "QUEUED",
                "hparams": {"lr": 0.1, "layers": 3},
                "total_batches": 0,
                "best_validation": None,
                "latest_checkpoint": None,
                "restarts": 0,
                "last_error": None,
                "waiting": None,
                "parent_trial_id": None,
                "search_round": None,
            },
        ],
    }
    assert master.calls("GetExperiment")[0].id == 7


def test_describe_human(master: FakeApi) -> None:
    config = dict(
        CONFIG,
        hyperparameters={
            "global_batch_size": 16,
            "lr": {"type": "log", "minval": -3, "maxval": -1},
        },
    )
    trial = make_trial(11, hparams={"global_batch_size": 16, "lr": 0.0031622776})
    master.responses["GetExperiment"] = api_pb2.GetExperimentResponse(
        experiment=make_experiment(config=config), trials=[trial]
    )

    done = run_cli("e", "describe", 7, master=master)

    assert_ok(done)
    assert "State:" in done.stdout
    assert "RUNNING" in done.stdout
    assert "Seed:            0\n" in done.stdout
    # HPARAMS: what the search varies, with 4 significant digits; not its constants.
    assert done.stdout.strip().splitlines()[-1].endswith("lr=0.003162")
    assert "global_batch_size" not in done.stdout


def test_list_trials_json(master: FakeApi) -> None:
    master.responses["GetExperiment"] = experiment_response(
        ACTIVE, [make_trial(11), make_trial(12, common_pb2.TRIAL_STATE_PAUSED)]
    )

    done = run_cli("e", "list-trials", 7, "--json", master=master)

    assert_ok(done)
    trials = json.loads(done.stdout.strip().splitlines()[-1])
    assert [(t["id"], t["state"]) for t in trials] == [(11, "RUNNING"), (12, "PAUSED")]
    assert set(trials[0]) == {
        "id",
        "state",
        "hparams",
        "total_batches",
        "best_validation",
        "latest_checkpoint",
        "restarts",
        "last_error",
        "waiting",
        "parent_trial_id",
        "search_round",
    }


@pytest.mark.parametrize(
    ("verb", "kind"),
    [
        ("pause", api_pb2.EXPERIMENT_ACTION_PAUSE),
        ("activate", api_pb2.EXPERIMENT_ACTION_ACTIVATE),
        ("cancel", api_pb2.EXPERIMENT_ACTION_CANCEL),
        ("kill", api_pb2.EXPERIMENT_ACTION_KILL),
        ("archive", api_pb2.EXPERIMENT_ACTION_ARCHIVE),
        ("unarchive", api_pb2.EXPERIMENT_ACTION_UNARCHIVE),
    ],
)
def test_actions_send_their_enum(master: FakeApi, verb: str, kind: int) -> None:
    master.responses["ExperimentAction"] = make_experiment(9)
    master.responses["GetExperiment"] = experiment_response(common_pb2.EXPERIMENT_STATE_CANCELED)

    done = run_cli("e", verb, 9, master=master)

    assert_ok(done)
    [request] = master.calls("ExperimentAction")
    assert (request.id, request.action) == (9, kind)
    assert "experiment 9" in done.stdout


def test_action_not_found_prints_server_message(master: FakeApi) -> None:
    master.errors["ExperimentAction"] = (grpc.StatusCode.NOT_FOUND, "experiment 404 not found")

    done = run_cli("experiment", "kill", 404, master=master)

    assert done.stderr.strip() == "error: experiment 404 not found"
    assert_one_line_error(done)


def test_failed_precondition_prints_server_message(master: FakeApi) -> None:
    master.errors["ExperimentAction"] = (
        grpc.StatusCode.FAILED_PRECONDITION,
        "experiment 3 is COMPLETED; only active experiments can be paused",
    )

    done = run_cli("e", "pause", 3, master=master)

    assert_one_line_error(done, "only active experiments can be paused")


def test_wait_until_completed(master: FakeApi) -> None:
    answers = iter([ACTIVE, ACTIVE, COMPLETED])
    master.responses["GetExperiment"] = lambda _: experiment_response(next(answers))

    done = run_cli("e", "wait", 7, master=master)

    assert_ok(done)
    assert "COMPLETED" in done.stdout
    assert len(master.calls("GetExperiment")) == 3


def test_wait_canceled_exits_1(master: FakeApi) -> None:
    master.responses["GetExperiment"] = experiment_response(common_pb2.EXPERIMENT_STATE_CANCELED)

    done = run_cli("e", "wait", 7, master=master)

    assert_one_line_error(done, "experiment 7 ended in state CANCELED")


def test_wait_timeout(master: FakeApi) -> None:
    master.responses["GetExperiment"] = experiment_response(ACTIVE)

    done = run_cli("e", "wait", 7, "--timeout", "0.3", master=master)

    assert_one_line_error(done, "experiment 7 is still ACTIVE after 0.3 s")


def test_create_prints_config_warnings(master: FakeApi, tmp_path: Path, model_dir: Path) -> None:
    master.responses["CreateExperiment"] = created(9)
    config = tmp_path / "ported.yaml"
    config.write_text(yaml.safe_dump(dict(CONFIG, workspace="w", debug=False)))

    done = run_cli("e", "create", config, model_dir, master=master)

    assert_ok(done)
    assert "workspace" not in done.stderr  # a key Assay has: no warning
    assert "warning: debug: has no effect" in done.stderr


def test_create_epochs_without_records_per_epoch_refused_locally(
    master: FakeApi, tmp_path: Path, model_dir: Path
) -> None:
    searcher = {"name": "single", "metric": "val_loss", "max_length": {"epochs": 1}}
    config = tmp_path / "epochs.yaml"
    config.write_text(yaml.safe_dump(dict(CONFIG, searcher=searcher)))

    done = run_cli("e", "create", config, model_dir, master=master)

    assert done.returncode == 1
    assert "searcher.max_length" in done.stderr
    assert "records_per_epoch" in done.stderr
    assert master.requests == []


def _stopping_experiment(master: FakeApi, state: int) -> None:
    """Trials 4 and 5 running and 3 completed; after the action's first read, the
    experiment is in `state` and its two running trials CANCELED."""
    trials = {
        3: common_pb2.TRIAL_STATE_COMPLETED,
        4: common_pb2.TRIAL_STATE_RUNNING,
        5: common_pb2.TRIAL_STATE_QUEUED,
    }
    reads = []

    def read(request: api_pb2.GetExperimentRequest) -> api_pb2.GetExperimentResponse:
        reads.append(request)
        if len(reads) == 1:
            return experiment_response(trials=[make_trial(i, s) for i, s in trials.items()])
        ended = {i: s if i == 3 else common_pb2.TRIAL_STATE_CANCELED for i, s in trials.items()}
        return experiment_response(state, [make_trial(i, s) for i, s in ended.items()])

    master.responses["GetExperiment"] = read


def test_kill_says_how_many_trials_it_stopped(master: FakeApi) -> None:
    _stopping_experiment(master, common_pb2.EXPERIMENT_STATE_CANCELED)
    master.responses["ExperimentAction"] = make_experiment(
        7, common_pb2.EXPERIMENT_STATE_STOPPING_KILLED
    )

    done = run_cli("experiment", "kill", 7, master=master)

    assert_ok(done)
    assert done.stdout == "experiment 7 killed (CANCELED): 2 trials (4, 5) stopped\n"
    assert "STOPPING" not in done.stdout


def test_a_kill_still_under_way_says_so(master: FakeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    from assay.cli import _actions

    _stopping_experiment(master, common_pb2.EXPERIMENT_STATE_STOPPING_KILLED)
    master.responses["ExperimentAction"] = make_experiment(
        7, common_pb2.EXPERIMENT_STATE_STOPPING_KILLED
    )
    monkeypatch.setattr(_actions, "KILL_WAIT_S", 0.3)
    monkeypatch.setenv("ASSAY_MASTER", master.address)
    monkeypatch.setenv("ASSAY_POLL_SECONDS", "0.05")

    done = CliRunner().invoke(cli, ["experiment", "kill", "7"])

    assert done.exit_code == 0, done.output
    assert done.output == (
        "experiment 7 is being killed: 2 trials (4, 5) still stopping; "
        "`assay experiment wait 7` waits for them\n"
    )


def test_cancel_and_pause_say_what_their_trials_do(master: FakeApi) -> None:
    _stopping_experiment(master, common_pb2.EXPERIMENT_STATE_STOPPING_CANCELED)
    master.responses["ExperimentAction"] = make_experiment(
        7, common_pb2.EXPERIMENT_STATE_STOPPING_CANCELED
    )
    canceled = run_cli("experiment", "cancel", 7, master=master)
    _stopping_experiment(master, common_pb2.EXPERIMENT_STATE_PAUSED)
    master.responses["ExperimentAction"] = make_experiment(7, common_pb2.EXPERIMENT_STATE_PAUSED)
    paused = run_cli("experiment", "pause", 7, master=master)

    assert_ok(canceled)
    assert canceled.stdout == (
        "experiment 7 canceling: 2 trials (4, 5) checkpoint, then stop; "
        "`assay experiment wait 7` waits for them\n"
    )
    assert_ok(paused)
    assert paused.stdout == (
        "experiment 7 paused: 2 trials (4, 5) checkpoint and give back their slots; "
        "`assay experiment activate 7` resumes them\n"
    )


def test_list_state_filters_group_transient_states_under_where_they_lead(
    master: FakeApi,
) -> None:
    master.responses["ListExperiments"] = api_pb2.ListExperimentsResponse()

    grouped = run_cli("e", "list", "--state", "canceled", "--state", "ERROR", master=master)
    exact = run_cli("e", "list", "--state", "stopping_killed", master=master)
    shown = run_cli("e", "list", "--help", master=master)
    refused = run_cli("e", "list", "--state", "STOPPING", master=master)

    assert_ok(grouped)
    first, second = master.calls("ListExperiments")
    assert list(first.states) == [
        common_pb2.EXPERIMENT_STATE_STOPPING_CANCELED,
        common_pb2.EXPERIMENT_STATE_STOPPING_KILLED,
        common_pb2.EXPERIMENT_STATE_CANCELED,
        common_pb2.EXPERIMENT_STATE_ERROR,
    ]
    assert_ok(exact)
    assert list(second.states) == [common_pb2.EXPERIMENT_STATE_STOPPING_KILLED]
    assert_ok(shown)
    offered = shown.stdout.split("--state [", 1)[1].split("]", 1)[0]
    assert offered.upper().split("|") == ["ACTIVE", "PAUSED", "COMPLETED", "CANCELED", "ERROR"]
    assert_one_line_error(refused, "'STOPPING' is not one of")
