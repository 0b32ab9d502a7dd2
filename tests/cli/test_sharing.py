"""`assay job list` and `assay experiment set`: what they send, print, and refuse."""

from __future__ import annotations

import json

import grpc
from google.protobuf import struct_pb2

from assay.proto import api_pb2, common_pb2

from .conftest import FakeApi, assert_ok, assert_one_line_error, run_cli


def _queue() -> api_pb2.GetQueueResponse:
    cpu = common_pb2.SLOT_TYPE_CPU
    return api_pb2.GetQueueResponse(
        trials=[
            api_pb2.QueuedTrial(
                trial_id=7,
                experiment_id=3,
                experiment_name="heavy",
                priority=42,
                slots=1,
                slot_type=cpu,
                position=1,
                wait_kind="max_slots",
                waiting="its experiment holds 2 of its max_slots 2 and the trial needs 1 more",
                resource_pool="default",
            ),
            api_pb2.QueuedTrial(
                trial_id=9,
                experiment_id=4,
                experiment_name="big",
                priority=42,
                slots=8,
                slot_type=cpu,
                position=2,
                reason="needs 8 CPU slots; the cluster has 4 (2 agents)",
                wait_kind="too_large",
                waiting="needs 8 CPU slots; the cluster has 4 (2 agents)",
                resource_pool="default",
            ),
        ]
    )


def test_job_list_shows_positions_and_reasons(master: FakeApi) -> None:
    master.responses["GetQueue"] = _queue()
    done = run_cli("job", "list", master=master)
    assert_ok(done)
    lines = done.stdout.splitlines()
    assert lines[0].split() == [
        "#",
        "TRIAL",
        "EXPERIMENT",
        "POOL",
        "PRIORITY",
        "SLOTS",
        "WAITS",
        "FOR",
        "WHY",
    ]
    assert lines[1].split()[:3] == ["1", "7", "3"]
    assert "max_slots" in lines[1]
    assert "holds 2 of its max_slots 2" in lines[1]
    assert "too_large" in lines[2]
    assert "the cluster has 4" in lines[2]


def test_job_list_json_and_an_empty_queue(master: FakeApi) -> None:
    master.responses["GetQueue"] = _queue()
    done = run_cli("j", "list", "--json", master=master)
    assert_ok(done)
    jobs = json.loads(done.stdout.strip().splitlines()[-1])
    assert [(j["position"], j["trial_id"], j["wait_kind"]) for j in jobs] == [
        (1, 7, "max_slots"),
        (2, 9, "too_large"),
    ]
    assert jobs[0]["slot_type"] == "CPU"
    assert jobs[0]["resource_pool"] == "default"
    master.responses["GetQueue"] = api_pb2.GetQueueResponse()
    empty = run_cli("job", "list", master=master)
    assert_ok(empty)
    assert empty.stdout.strip() == "no trials are waiting for slots"


def test_experiment_set_sends_the_change_and_says_the_new_value(master: FakeApi) -> None:
    config = struct_pb2.Struct()
    config.update({"resources": {"weight": 2.5}})
    master.responses["SetExperimentResource"] = common_pb2.Experiment(
        id=5, priority=42, config=config
    )
    done = run_cli("e", "set", "weight", "5", "2.5", master=master)
    assert_ok(done)
    assert done.stdout.strip() == "experiment 5: weight is now 2.5"
    [request] = master.calls("SetExperimentResource")
    assert (request.id, request.name, request.value) == (5, "weight", "2.5")


def test_experiment_set_refusals_are_one_line(master: FakeApi) -> None:
    bad_name = run_cli("e", "set", "slots", "5", "2", master=master)
    assert_one_line_error(bad_name, "'slots' is not one of", "max-slots")
    master.errors["SetExperimentResource"] = (
        grpc.StatusCode.INVALID_ARGUMENT,
        "weight must be a number greater than 0, got 0",
    )
    refused = run_cli("e", "set", "weight", "5", "0", master=master)
    assert_one_line_error(refused, "weight must be a number greater than 0, got 0")
