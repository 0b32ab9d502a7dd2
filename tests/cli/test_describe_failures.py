"""`assay experiment describe` says why its trials failed, from each trial's last_error:
one line per cause, under the table of trials."""

from __future__ import annotations

import json

from assay.proto import common_pb2

from .conftest import FakeApi, assert_ok, experiment_response, make_trial, run_cli

ERROR = common_pb2.TRIAL_STATE_ERROR
TRACEBACK_TAIL = (
    "run 1: local-0: rank 0 exited with code 1; its last output:\n"
    '  File "train.py", line 4, in <module>\n'
    "RuntimeError: CUDA out of memory"
)


def _failures(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("trial")]


def test_an_experiment_in_error_names_its_failed_trial_and_the_cause(master: FakeApi) -> None:
    master.responses["GetExperiment"] = experiment_response(
        common_pb2.EXPERIMENT_STATE_ERROR, [make_trial(17, ERROR, last_error=TRACEBACK_TAIL)]
    )

    done = run_cli("e", "describe", 7, master=master)
    as_json = run_cli("e", "describe", 7, "--json", master=master)

    assert_ok(done)
    assert _failures(done.stdout) == [
        "trial 17 failed: RuntimeError: CUDA out of memory (see assay trial logs 17)"
    ]
    assert_ok(as_json)
    (trial,) = json.loads(as_json.stdout.splitlines()[-1])["trials"]
    assert trial["last_error"] == TRACEBACK_TAIL


def test_trials_that_failed_the_same_way_share_a_line(master: FakeApi) -> None:
    same = "run 1: exit codes [1]"
    master.responses["GetExperiment"] = experiment_response(
        common_pb2.EXPERIMENT_STATE_ERROR,
        [make_trial(i, ERROR, last_error=same) for i in range(1, 9)]
        + [make_trial(9, ERROR, last_error="run 2: killed by signal 9")],
    )

    done = run_cli("e", "describe", 7, master=master)

    assert_ok(done)
    assert _failures(done.stdout) == [
        f"trials 1, 2, 3, 4, 5 and 3 more failed: {same} (see assay trial logs 1)",
        "trial 9 failed: run 2: killed by signal 9 (see assay trial logs 9)",
    ]


def test_a_failure_with_no_error_recorded_says_where_to_look(master: FakeApi) -> None:
    master.responses["GetExperiment"] = experiment_response(
        common_pb2.EXPERIMENT_STATE_ERROR, [make_trial(4, ERROR), make_trial(5, ERROR)]
    )

    done = run_cli("e", "describe", 7, master=master)

    assert_ok(done)
    assert _failures(done.stdout) == [
        "trials 4, 5 failed with no error recorded (see assay trial logs 4)"
    ]


def test_only_trials_in_error_are_named(master: FakeApi) -> None:
    # A trial restarted after a failure keeps its last_error while it runs again; a
    # completed experiment's failed trial is still worth a line.
    master.responses["GetExperiment"] = experiment_response(
        common_pb2.EXPERIMENT_STATE_COMPLETED,
        [
            make_trial(1, common_pb2.TRIAL_STATE_COMPLETED),
            make_trial(2, common_pb2.TRIAL_STATE_RUNNING, last_error="run 1: exit codes [1]"),
            make_trial(3, ERROR, last_error="run 3: exit codes [2]"),
        ],
    )

    done = run_cli("e", "describe", 7, master=master)

    assert_ok(done)
    assert _failures(done.stdout) == [
        "trial 3 failed: run 3: exit codes [2] (see assay trial logs 3)"
    ]
