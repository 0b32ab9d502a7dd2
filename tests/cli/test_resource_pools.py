"""`assay resource-pool list`, pools in `agent list`, and `agent disable --drain`."""

from __future__ import annotations

import json

import grpc

from assay.proto import api_pb2, common_pb2

from .conftest import FakeApi, assert_ok, assert_one_line_error, run_cli

CPU, CUDA = common_pb2.SLOT_TYPE_CPU, common_pb2.SLOT_TYPE_CUDA


def pools() -> api_pb2.ListResourcePoolsResponse:
    return api_pb2.ListResourcePoolsResponse(
        pools=[
            api_pb2.ResourcePool(
                name="default",
                description="CPU boxes",
                scheduler="priority",
                agents=["c1", "c2"],
                slots=[api_pb2.PoolSlots(slot_type=CPU, total=8, used=3, free=5)],
                queued_trials=2,
                default=True,
            ),
            api_pb2.ResourcePool(
                name="gpu",
                scheduler="fair_share",
                bindings=[
                    api_pb2.PoolBinding(workspace="vision", from_settings=True),
                    api_pb2.PoolBinding(workspace="nlp"),
                ],
            ),
        ]
    )


def test_resource_pool_list_json(master: FakeApi) -> None:
    master.responses["ListResourcePools"] = pools()

    done = run_cli("resource-pool", "list", "--json", master=master)

    assert_ok(done)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [
        {
            "name": "default",
            "description": "CPU boxes",
            "scheduler": "priority",
            "default": True,
            "agents": ["c1", "c2"],
            "slots": [{"type": "CPU", "total": 8, "used": 3, "free": 5}],
            "queued_trials": 2,
            "workspaces": [],
        },
        {
            "name": "gpu",
            "description": "",
            "scheduler": "fair_share",
            "default": False,
            "agents": [],
            "slots": [],
            "queued_trials": 0,
            "workspaces": [
                {"workspace": "vision", "from_settings": True},
                {"workspace": "nlp", "from_settings": False},
            ],
        },
    ]


def test_resource_pool_list_table(master: FakeApi) -> None:
    master.responses["ListResourcePools"] = pools()

    done = run_cli("rp", "list", master=master)

    assert_ok(done)
    header, first, second = done.stdout.strip().splitlines()
    assert header.split() == [
        "NAME",
        "SCHEDULER",
        "AGENTS",
        "TYPE",
        "SLOTS",
        "USED",
        "FREE",
        "QUEUED",
        "WORKSPACES",
        "DESCRIPTION",
    ]
    assert first.split() == [
        "default",
        "(default)",
        "priority",
        "2",
        "CPU",
        "8",
        "3",
        "5",
        "2",
        "all",
        "CPU",
        "boxes",
    ]
    assert second.split()[:3] == ["gpu", "fair_share", "0"]
    assert second.split()[-2:] == ["vision,nlp", "-"]  # no description


def test_resource_pool_list_needs_a_master_that_has_it(master: FakeApi) -> None:
    master.errors["ListResourcePools"] = (grpc.StatusCode.UNIMPLEMENTED, "Method not found!")

    done = run_cli("resource-pool", "list", master=master)

    assert done.returncode != 0
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def agent(**fields: object) -> common_pb2.Agent:
    slots = [
        common_pb2.Slot(agent_id="g1", index=0, type=CUDA, allocation_id="x", trial_id=3),
        common_pb2.Slot(agent_id="g1", index=1, type=CUDA),
    ]
    agent = common_pb2.Agent(id="g1", slot_type=CUDA, connected=True, slots=slots)
    for name, value in fields.items():
        setattr(agent, name, value)
    return agent


def test_agent_list_shows_pool_label_and_draining(master: FakeApi) -> None:
    master.responses["ListAgents"] = api_pb2.ListAgentsResponse(
        agents=[agent(resource_pool="gpu", agent_label="a100", enabled=False, draining=True)]
    )

    table = run_cli("agent", "list", master=master)
    listed = run_cli("agent", "list", "--json", master=master)

    assert_ok(table)
    header, row = table.stdout.strip().splitlines()
    assert header.split()[:8] == [
        "ID",
        "ADDRESS",
        "TYPE",
        "USED",
        "POOL",
        "LABEL",
        "CONNECTED",
        "ENABLED",
    ]
    assert row.split()[:8] == ["g1", "-", "CUDA", "1/2", "gpu", "a100", "yes", "draining"]
    [shown] = json.loads(listed.stdout.strip().splitlines()[-1])
    assert (shown["resource_pool"], shown["agent_label"]) == ("gpu", "a100")
    assert shown["draining"] is True


def test_agent_disable_drain(master: FakeApi) -> None:
    master.responses["SetAgentEnabled"] = lambda r: agent(enabled=r.enabled, draining=r.drain)

    assert_ok(drained := run_cli("agent", "disable", "--drain", "g1", master=master))
    assert_ok(disabled := run_cli("agent", "disable", "g1", master=master))

    assert drained.stdout.strip() == "agent g1 draining (1 slot busy)"
    assert disabled.stdout.strip() == "agent g1 disabled"
    assert [(r.enabled, r.drain) for r in master.calls("SetAgentEnabled")] == [
        (False, True),
        (False, False),
    ]


def test_agent_disable_drain_of_an_unknown_agent(master: FakeApi) -> None:
    master.errors["SetAgentEnabled"] = (grpc.StatusCode.NOT_FOUND, "agent 'nope' is not connected")

    done = run_cli("agent", "disable", "--drain", "nope", master=master)

    assert_one_line_error(done, "agent 'nope' is not connected")


def bound(*names: str) -> api_pb2.ResourcePoolWorkspaces:
    return api_pb2.ResourcePoolWorkspaces(
        pool="gpu",
        bindings=[api_pb2.PoolBinding(workspace=n, from_settings=n == "vision") for n in names],
    )


def test_resource_pool_bind_and_unbind(master: FakeApi) -> None:
    master.responses["BindResourcePool"] = bound("nlp", "vision")
    master.responses["UnbindResourcePool"] = bound()

    assert_ok(bind := run_cli("rp", "bind", "gpu", "nlp", master=master))
    assert_ok(unbind := run_cli("resource-pool", "unbind", "gpu", "nlp", master=master))

    assert bind.stdout.strip() == "pool gpu takes experiments of workspaces nlp, vision"
    assert unbind.stdout.strip() == "pool gpu is open to every workspace"
    assert [(r.pool, r.workspace) for r in master.calls("BindResourcePool")] == [("gpu", "nlp")]
    assert [(r.pool, r.workspace) for r in master.calls("UnbindResourcePool")] == [("gpu", "nlp")]


def test_resource_pool_list_workspaces(master: FakeApi) -> None:
    master.responses["ListResourcePoolWorkspaces"] = bound("nlp", "vision")

    table = run_cli("rp", "list-workspaces", "gpu", master=master)
    listed = run_cli("rp", "list-workspaces", "gpu", "--json", master=master)

    assert_ok(table)
    assert [line.split() for line in table.stdout.strip().splitlines()] == [
        ["WORKSPACE", "BOUND", "BY"],
        ["nlp", "bind"],
        ["vision", "settings"],
    ]
    assert json.loads(listed.stdout.strip().splitlines()[-1]) == [
        {"workspace": "nlp", "from_settings": False},
        {"workspace": "vision", "from_settings": True},
    ]
    assert [r.pool for r in master.calls("ListResourcePoolWorkspaces")] == ["gpu", "gpu"]


def test_resource_pool_list_workspaces_of_an_open_pool(master: FakeApi) -> None:
    master.responses["ListResourcePoolWorkspaces"] = bound()

    done = run_cli("rp", "list-workspaces", "gpu", master=master)

    assert_ok(done)
    assert done.stdout.strip() == "pool gpu is bound to no workspace: it is open to every workspace"


def test_resource_pool_bind_refusals_are_one_line(master: FakeApi) -> None:
    master.errors["BindResourcePool"] = (
        grpc.StatusCode.PERMISSION_DENIED,
        "only an administrator may bind resource pools to workspaces; bob is not",
    )
    master.errors["UnbindResourcePool"] = (
        grpc.StatusCode.FAILED_PRECONDITION,
        "pool 'gpu' is bound to workspace 'vision' by the master's settings",
    )

    bind = run_cli("rp", "bind", "gpu", "nlp", master=master)
    unbind = run_cli("rp", "unbind", "gpu", "vision", master=master)
    missing = run_cli("rp", "bind", "gpu", master=master)

    assert_one_line_error(bind, "only an administrator may bind resource pools")
    assert_one_line_error(unbind, "bound to workspace 'vision' by the master's settings")
    assert_one_line_error(missing, "missing argument 'WORKSPACE'")
