"""`assay agent|slot|master`, the master address, and what an unreachable master looks like."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import grpc

from assay.proto import api_pb2, common_pb2

from .conftest import FakeApi, assert_ok, assert_one_line_error, run_cli

CUDA = common_pb2.SLOT_TYPE_CUDA


def agents() -> api_pb2.ListAgentsResponse:
    return api_pb2.ListAgentsResponse(
        agents=[
            common_pb2.Agent(
                id="gpu-1",
                address="10.0.0.5",
                slot_type=CUDA,
                connected=True,
                enabled=True,
                devices=[common_pb2.Device(index=0, type=CUDA, name="NVIDIA H100")],
                slots=[
                    common_pb2.Slot(
                        agent_id="gpu-1",
                        index=0,
                        type=CUDA,
                        enabled=True,
                        allocation_id="alloc-1",
                        trial_id=11,
                    ),
                    common_pb2.Slot(agent_id="gpu-1", index=1, type=CUDA, enabled=True),
                ],
                cpu_utilization=0.25,
            ),
            common_pb2.Agent(id="cpu-1", slot_type=common_pb2.SLOT_TYPE_CPU, enabled=False),
        ]
    )


def test_agent_list_json(master: FakeApi) -> None:
    master.responses["ListAgents"] = agents()

    done = run_cli("a", "list", "--json", master=master)

    assert_ok(done)
    listed = json.loads(done.stdout.strip().splitlines()[-1])
    assert [(a["id"], a["slot_type"], a["slots"], a["used_slots"]) for a in listed] == [
        ("gpu-1", "CUDA", 2, 1),
        ("cpu-1", "CPU", 0, 0),
    ]
    assert listed[0]["devices"][0]["name"] == "NVIDIA H100"
    assert (listed[1]["enabled"], listed[1]["connected"]) == (False, False)


def test_agent_list_table(master: FakeApi) -> None:
    master.responses["ListAgents"] = agents()

    done = run_cli("agent", "list", master=master)

    assert_ok(done)
    lines = done.stdout.strip().splitlines()
    assert lines[0].split()[:4] == ["ID", "ADDRESS", "TYPE", "USED"]
    assert lines[1].split()[:4] == ["gpu-1", "10.0.0.5", "CUDA", "1/2"]
    assert (
        len({line.index(word) for line, word in zip(lines, ["TYPE", "CUDA", "CPU"], strict=True)})
        == 1
    )


def test_slot_list_json(master: FakeApi) -> None:
    master.responses["ListAgents"] = agents()

    done = run_cli("s", "list", "--json", master=master)

    assert_ok(done)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [
        {
            "agent_id": "gpu-1",
            "index": 0,
            "type": "CUDA",
            "enabled": True,
            "busy": True,
            "allocation_id": "alloc-1",
            "trial_id": 11,
            "resource_pool": "",
        },
        {
            "agent_id": "gpu-1",
            "index": 1,
            "type": "CUDA",
            "enabled": True,
            "busy": False,
            "allocation_id": None,
            "trial_id": None,
            "resource_pool": "",
        },
    ]


def test_a_slot_of_another_workspace_is_busy_without_its_ids(master: FakeApi) -> None:
    """The master leaves out the ids of a trial the caller may not see, and says busy."""
    hidden = common_pb2.Slot(agent_id="gpu-1", index=0, type=CUDA, enabled=True, busy=True)
    master.responses["ListAgents"] = api_pb2.ListAgentsResponse(
        agents=[common_pb2.Agent(id="gpu-1", slot_type=CUDA, connected=True, slots=[hidden])]
    )

    table = run_cli("slot", "list", master=master)
    agents = run_cli("agent", "list", "--json", master=master)

    assert_ok(table)
    _header, row = table.stdout.strip().splitlines()
    assert row.split() == ["gpu-1", "0", "CUDA", "yes", "busy", "-", "-"]  # no trial, no id
    assert json.loads(agents.stdout.strip().splitlines()[-1])[0]["used_slots"] == 1


def test_agent_enable_disable(master: FakeApi) -> None:
    master.responses["SetAgentEnabled"] = lambda r: common_pb2.Agent(id=r.id, enabled=r.enabled)

    assert_ok(disabled := run_cli("a", "disable", "gpu-1", master=master))
    assert_ok(enabled := run_cli("a", "enable", "gpu-1", master=master))

    assert disabled.stdout.strip() == "agent gpu-1 disabled"
    assert enabled.stdout.strip() == "agent gpu-1 enabled"
    assert [(r.id, r.enabled) for r in master.calls("SetAgentEnabled")] == [
        ("gpu-1", False),
        ("gpu-1", True),
    ]


def test_unknown_agent(master: FakeApi) -> None:
    master.errors["SetAgentEnabled"] = (grpc.StatusCode.NOT_FOUND, "agent nope is not known")

    done = run_cli("a", "enable", "nope", master=master)

    assert_one_line_error(done, "agent nope is not known")


def info() -> api_pb2.MasterInfo:
    return api_pb2.MasterInfo(
        version="0.1.0", cluster_id="c-1", store="sqlite", agents=2, slots=8, free_slots=3
    )


def test_master_info_json(master: FakeApi) -> None:
    master.responses["GetMasterInfo"] = info()

    done = run_cli("master", "info", "--json", master=master)

    assert_ok(done)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "address": master.address,
        "version": "0.1.0",
        "cluster_id": "c-1",
        "store": "sqlite",
        "agents": 2,
        "slots": 8,
        "free_slots": 3,
        "queued_trials": 0,
        "resource_pools": [],
        "default_resource_pool": "",
    }


def test_master_address_from_environment(master: FakeApi) -> None:
    master.responses["GetMasterInfo"] = info()
    env = dict(os.environ, ASSAY_MASTER=master.address)

    done = subprocess.run(
        [sys.executable, "-m", "assay.cli.main", "master", "info"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )

    assert_ok(done)
    assert "sqlite" in done.stdout
    assert len(master.calls("GetMasterInfo")) == 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_unreachable_master_is_one_line() -> None:
    address = f"127.0.0.1:{free_port()}"

    for args in (["e", "list"], ["master", "info"], ["t", "logs", "1", "-f"]):
        done = run_cli(*args, master=address, timeout=30)

        assert_one_line_error(
            done,
            f"cannot reach the master at {address}",
            "is assay-master running? set --master or ASSAY_MASTER",
        )


def test_default_master_address_is_named() -> None:
    done = run_cli("--help")
    assert_ok(done)
    assert "127.0.0.1:8090" in done.stdout
    for alias in ("experiment (e)", "trial (t)", "agent (a)", "slot (s)", "checkpoint (c)"):
        assert alias in done.stdout


def test_agent_remove(master: FakeApi) -> None:
    master.responses["RemoveAgent"] = lambda r: api_pb2.RemoveAgentResponse(disconnected=True)

    done = run_cli("agent", "remove", "gpu-1", master=master)

    assert_ok(done)
    assert [r.id for r in master.calls("RemoveAgent")] == ["gpu-1"]
    assert "agent gpu-1 removed (it was connected" in done.stdout
    master.errors["RemoveAgent"] = (grpc.StatusCode.PERMISSION_DENIED, "only an administrator")
    assert_one_line_error(run_cli("a", "remove", "gpu-1", master=master), "only an administrator")
