"""The API is defined once, in proto/: generated code is fresh and JSON derives from it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from google.protobuf import json_format

from assay.proto import agent_pb2, api_pb2, common_pb2, trial_pb2

ROOT = Path(__file__).resolve().parent.parent


def test_generated_code_is_fresh() -> None:
    done = subprocess.run(
        [sys.executable, "scripts/gen_proto.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_messages_round_trip_through_json() -> None:
    experiment = common_pb2.Experiment(
        id=7,
        name="mnist",
        state=common_pb2.EXPERIMENT_STATE_PAUSED,
        labels=["vision"],
        best_validation=0.25,
    )
    experiment.config.update({"searcher": {"name": "asha", "max_trials": 16}})
    text = json_format.MessageToJson(experiment)
    assert '"state": "EXPERIMENT_STATE_PAUSED"' in text
    assert json_format.Parse(text, common_pb2.Experiment()) == experiment


def test_every_service_is_declared() -> None:
    services = {
        name
        for module in (api_pb2, agent_pb2, trial_pb2)
        for name in module.DESCRIPTOR.services_by_name
    }
    assert services == {"Api", "AgentService", "TrialService"}
    connect = agent_pb2.DESCRIPTOR.services_by_name["AgentService"].methods_by_name["Connect"]
    assert connect.client_streaming
    assert connect.server_streaming
