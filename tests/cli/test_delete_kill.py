"""`assay experiment delete` and `assay trial kill` against a fake master: what they send,
ask and print, and how a refusal or a partial failure reads."""

from __future__ import annotations

import grpc

from assay.proto import api_pb2, common_pb2

from .conftest import TRACEBACK, FakeApi, assert_ok, assert_one_line_error, run_cli

UUID = "6f1c2a9e-0000-4000-8000-000000000001"
OTHER = "6f1c2a9e-0000-4000-8000-000000000002"


def test_delete_asks_first(master: FakeApi) -> None:
    done = run_cli("experiment", "delete", "7", master=master)  # stdin gives no answer

    assert_one_line_error(done, "nothing deleted", "--yes")
    assert "Delete experiment 7, its metrics, logs and checkpoints for good? [y/N]" in done.stdout
    assert not master.calls("DeleteExperiment")


def test_delete_with_yes(master: FakeApi) -> None:
    master.responses["DeleteExperiment"] = api_pb2.DeleteExperimentResponse(
        deleted_checkpoints=[UUID, OTHER]
    )

    done = run_cli("e", "delete", "7", "--yes", master=master)

    assert_ok(done)
    assert [r.id for r in master.calls("DeleteExperiment")] == [7]
    assert done.stdout.strip() == "deleted experiment 7 and 2 checkpoints"


def test_delete_refused_by_the_master(master: FakeApi) -> None:
    reason = (
        "experiment 7 cannot be deleted: its checkpoints are registered as model 'm' "
        "version 2; delete those versions (assay model delete-version) first"
    )
    master.errors["DeleteExperiment"] = (grpc.StatusCode.FAILED_PRECONDITION, reason)

    done = run_cli("e", "delete", "7", "-y", master=master)

    assert_one_line_error(done, reason)


def test_delete_names_files_left_in_storage_and_exits_1(master: FakeApi) -> None:
    master.responses["DeleteExperiment"] = api_pb2.DeleteExperimentResponse(
        deleted_checkpoints=[UUID], failed={OTHER: "AccessDenied (its files: s3://b/x)"}
    )

    done = run_cli("e", "delete", "7", "--yes", master=master)

    assert done.returncode == 1
    assert "deleted experiment 7 and 1 checkpoint\n" in done.stdout
    assert f"failed {OTHER}: AccessDenied (its files: s3://b/x)" in done.stderr
    assert "the files of 1 of its checkpoints could not be" in done.stderr
    assert TRACEBACK not in done.stderr


def test_trial_kill(master: FakeApi) -> None:
    master.responses["KillTrial"] = common_pb2.Trial(
        id=11, experiment_id=7, state=common_pb2.TRIAL_STATE_STOPPING
    )

    done = run_cli("trial", "kill", "11", master=master)

    assert_ok(done)
    assert [r.id for r in master.calls("KillTrial")] == [11]
    assert done.stdout.strip() == "trial 11 of experiment 7 being killed (state STOPPING)"


def test_trial_kill_refused(master: FakeApi) -> None:
    reason = "cannot kill trial 11: it has ended (COMPLETED)"
    master.errors["KillTrial"] = (grpc.StatusCode.FAILED_PRECONDITION, reason)

    assert_one_line_error(run_cli("t", "kill", "11", master=master), reason)
