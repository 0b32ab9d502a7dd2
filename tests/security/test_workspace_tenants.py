"""Tenants sharing one master: a victim, an attacker and an admin, with agents that speak
the real agent protocol (and a trial process reporting a checkpoint over the trial API).

- In the shared Default workspace every user may view every experiment, but only its
  owner and admins steer, change or delete it, its trials and its checkpoints.
- Agents show the allocation and trial ids on their slots only to admins and members
  of the experiment's workspace; to others a slot is busy, without ids (gRPC and HTTP).
- A resource pool bound to workspaces (in the settings, or by an admin at run time)
  takes experiments of those workspaces only; an unbound pool stays open to all.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest

from assay.master.fleet import ResourcePools
from assay.proto import api_pb2, api_pb2_grpc, common_pb2
from tests.credentials import authed_api, login
from tests.http.conftest import Site, open_site
from tests.master.conftest import Process, ScriptedAgent, eventually, experiment_yaml, model_archive

KILL = api_pb2.EXPERIMENT_ACTION_KILL
DENIED = grpc.StatusCode.PERMISSION_DENIED
POOLS = [
    {"name": "default"},
    {"name": "gpu", "workspaces": ["victims"]},  # the victims' pool, by the settings
    {"name": "shared"},  # open to all until an admin binds it
]


@dataclass
class Tenants:
    site: Site
    api: dict[str, api_pb2_grpc.ApiStub]  # by user: admin, victim, attacker
    tokens: dict[str, str]
    agents: dict[str, ScriptedAgent]  # by pool

    def create(self, user: str, *, activate: bool = True, **config: Any) -> int:
        request = api_pb2.CreateExperimentRequest(
            config_yaml=experiment_yaml(**config),
            model_definition=model_archive(),
            activate=activate,
        )
        eid: int = self.api[user].CreateExperiment(request).experiment.id
        return eid

    def http(self, user: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.tokens[user]}"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        reply = self.site.call(method, path, body=data, headers=headers, auth=False)
        return reply.status, reply.json() if reply.body else {}

    def end(self, experiment_id: int, pool: str = "default") -> None:
        """Kill the experiment (as the admin) and play its allocation's exit."""
        self.site.api.ExperimentAction(
            api_pb2.ExperimentActionRequest(id=experiment_id, action=KILL)
        )
        store = self.site.master.store
        runs = self.site.master.master.runs.values()
        for _ in [r for r in runs if r.experiment_id == experiment_id]:
            kill = self.agents[pool].next("kill").kill
            self.agents[pool].exited(kill.allocation_id, [137])
        eventually(lambda: store.get_experiment(experiment_id).state in ("CANCELED", "COMPLETED"))


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenants]:
    site = open_site(
        tmp_path_factory.mktemp("tenants") / "master", resource_pools=ResourcePools().parse(POOLS)
    )
    address = f"127.0.0.1:{site.master.port}"
    for name in ("victim", "attacker"):
        site.master.auth.create_user(name, f"{name}-password-1")
    # "victims" was made by the master at start, for its pool binding, with no members.
    site.api.SetWorkspaceMember(
        api_pb2.SetWorkspaceMemberRequest(workspace="victims", username="victim", role="admin")
    )
    site.api.CreateProject(api_pb2.CreateProjectRequest(workspace="victims", name="p"))
    api, tokens, channels = {"admin": site.api}, {"admin": site.token}, []
    for name in ("victim", "attacker"):
        tokens[name] = login(address, name, f"{name}-password-1")
        api[name], channel = authed_api(address, tokens[name])
        channels.append(channel)
    api["attacker"].CreateWorkspace(api_pb2.CreateWorkspaceRequest(name="attackers"))
    api["attacker"].CreateProject(api_pb2.CreateProjectRequest(workspace="attackers", name="p"))
    agents = {
        pool: ScriptedAgent(site.master.port, f"{pool}-agent", slots=2, pool=pool)
        for pool in ("default", "gpu", "shared")
    }
    yield Tenants(site, api, tokens, agents)
    for agent in agents.values():
        agent.close()
    for channel in channels:
        channel.close()
    site.close()


def _code(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    try:
        call()
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


def test_in_default_the_attacker_views_but_cannot_steer_or_delete_the_victims_work(
    tenants: Tenants,
) -> None:
    t, store = tenants, tenants.site.master.store
    eid = t.create("victim", name="victims-run")  # no workspace: Default
    start = t.agents["default"].next("start").start
    process = Process(t.site.master.port, start)
    checkpoint = process.report(10, 0.5)
    [trial] = store.list_trials(eid)
    attacker = t.api["attacker"]
    attacks: dict[str, Callable[[], object]] = {
        "kill": lambda: attacker.ExperimentAction(
            api_pb2.ExperimentActionRequest(id=eid, action=KILL)
        ),
        "pause": lambda: attacker.ExperimentAction(
            api_pb2.ExperimentActionRequest(id=eid, action=api_pb2.EXPERIMENT_ACTION_PAUSE)
        ),
        "cancel": lambda: attacker.ExperimentAction(
            api_pb2.ExperimentActionRequest(id=eid, action=api_pb2.EXPERIMENT_ACTION_CANCEL)
        ),
        "delete": lambda: attacker.DeleteExperiment(api_pb2.DeleteExperimentRequest(id=eid)),
        "delete checkpoint": lambda: attacker.DeleteCheckpoints(
            api_pb2.DeleteCheckpointsRequest(uuids=[checkpoint])
        ),
        "kill trial": lambda: attacker.KillTrial(api_pb2.KillTrialRequest(id=trial.id)),
        "set": lambda: attacker.SetExperimentResource(
            api_pb2.SetExperimentResourceRequest(id=eid, name="priority", value="1")
        ),
        "patch": lambda: attacker.PatchExperiment(
            api_pb2.PatchExperimentRequest(id=eid, name="mine now")
        ),
        "move": lambda: attacker.MoveExperiment(
            api_pb2.MoveExperimentRequest(id=eid, project="attackers/p")
        ),
    }
    for what, attack in attacks.items():
        code, details = _code(attack)
        assert code == DENIED, what
        assert f"experiment {eid} belongs to victim" in details, (what, details)
        assert "shared workspace 'Default'" in details, (what, details)
    status, body = t.http("attacker", "POST", f"/api/v1/experiments/{eid}/kill")
    assert status == 403, body
    status, body = t.http("attacker", "POST", "/api/v1/checkpoints/delete", {"uuids": [checkpoint]})
    assert status == 403, body

    # Nothing changed: still running where it was, its checkpoint kept, no kill sent.
    t.agents["default"].nothing(0.3)
    record = store.get_experiment(eid)
    assert (record.state, record.name, record.workspace) == ("ACTIVE", "victims-run", "Default")
    assert store.get_checkpoint(checkpoint).state == "COMPLETED"
    # The attacker still views it all.
    assert attacker.GetExperiment(api_pb2.GetExperimentRequest(id=eid)).experiment.id == eid
    listed = attacker.ListCheckpoints(api_pb2.ListCheckpointsRequest(experiment_id=eid))
    assert [c.uuid for c in listed.checkpoints] == [checkpoint]
    assert attacker.GetTrial(api_pb2.GetTrialRequest(id=trial.id)).id == trial.id
    # The owner steers their own; the admin ends it.
    victim = t.api["victim"]
    victim.SetExperimentResource(
        api_pb2.SetExperimentResourceRequest(id=eid, name="priority", value="7")
    )
    assert store.get_experiment(eid).priority == 7
    process.close()
    t.end(eid)


def test_agents_show_allocation_ids_only_to_members_of_the_experiments_workspace(
    tenants: Tenants,
) -> None:
    t = tenants
    eid = t.create("victim", workspace="victims", project="p")
    start = t.agents["default"].next("start").start

    def slots(user: str) -> list[common_pb2.Slot]:
        agents = t.api[user].ListAgents(api_pb2.ListAgentsRequest()).agents
        [agent] = [a for a in agents if a.id == "default-agent"]
        return list(agent.slots)

    for user in ("victim", "admin"):
        [taken] = [s for s in slots(user) if s.busy]
        assert (taken.allocation_id, taken.trial_id) == (start.allocation_id, start.trial_id)
    seen = slots("attacker")
    assert [s.busy for s in seen].count(True) == 1  # busy, but whose it is not said
    assert all(s.allocation_id == "" and s.trial_id == 0 for s in seen)
    status, body = t.http("attacker", "GET", "/api/v1/agents")
    assert status == 200
    text = json.dumps(body)
    assert start.allocation_id not in text
    [agent] = [a for a in body["agents"] if a["id"] == "default-agent"]
    assert [s.get("busy", False) for s in agent["slots"]].count(True) == 1
    assert all(not s.get("allocation_id") and not int(s.get("trial_id", 0)) for s in agent["slots"])
    status, body = t.http("victim", "GET", "/api/v1/agents")
    assert start.allocation_id in json.dumps(body)
    # The pools' totals still count the slot as used, for everyone.
    pools = t.api["attacker"].ListResourcePools(api_pb2.ListResourcePoolsRequest()).pools
    [default] = [p for p in pools if p.name == "default"]
    assert default.slots[0].used == 1
    t.end(eid)


def test_a_bound_pool_refuses_other_workspaces_and_an_unbound_pool_takes_all(
    tenants: Tenants,
) -> None:
    t = tenants
    gpu: dict[str, Any] = {"resources": {"resource_pool": "gpu"}}
    for where in ({"workspace": "attackers", "project": "p"}, {}):  # and Default
        code, details = _code(partial(t.create, "attacker", activate=False, **gpu, **where))
        assert code == DENIED
        assert "pool 'gpu' is bound to workspace 'victims'" in details, details
        assert "`assay resource-pool bind gpu" in details, details
    archive = base64.b64encode(model_archive()).decode()
    body = {"config_yaml": experiment_yaml(**gpu), "model_definition": archive}
    status, reply = t.http("attacker", "POST", "/api/v1/experiments", body)
    assert status == 403, reply
    assert "pool 'gpu' is bound" in json.dumps(reply)

    mine = t.create("victim", activate=False, workspace="victims", project="p", **gpu)
    shared = t.create(
        "attacker", activate=False, workspace="attackers", project="p",
        resources={"resource_pool": "shared"},
    )  # fmt: skip
    # A live experiment does not move to a workspace its pool refuses.
    code, details = _code(
        lambda: t.site.api.MoveExperiment(
            api_pb2.MoveExperimentRequest(id=mine, project="attackers/p")
        )
    )
    assert code == DENIED
    assert "pool 'gpu' is bound" in details
    assert t.site.master.store.get_experiment(mine).workspace == "victims"

    listed = t.api["attacker"].ListResourcePoolWorkspaces(
        api_pb2.ListResourcePoolWorkspacesRequest(pool="gpu")
    )
    assert [(b.workspace, b.from_settings) for b in listed.bindings] == [("victims", True)]
    for eid in (mine, shared):
        t.site.api.ExperimentAction(api_pb2.ExperimentActionRequest(id=eid, action=KILL))


def test_a_binding_made_at_run_time_holds_back_other_workspaces_until_it_is_removed(
    tenants: Tenants,
) -> None:
    t, store = tenants, tenants.site.master.store
    shared: dict[str, Any] = {"resources": {"resource_pool": "shared"}}
    waiting = t.create("attacker", activate=False, workspace="attackers", project="p", **shared)
    bind = api_pb2.BindResourcePoolRequest(pool="shared", workspace="victims")
    code, _ = _code(lambda: t.api["attacker"].BindResourcePool(bind))
    assert code == DENIED  # binding is for admins
    bound = t.site.api.BindResourcePool(bind)
    assert [(b.workspace, b.from_settings) for b in bound.bindings] == [("victims", False)]
    try:
        code, details = _code(
            lambda: t.create(
                "attacker", activate=False, workspace="attackers", project="p", **shared
            )
        )
        assert code == DENIED
        assert "pool 'shared' is bound to workspace 'victims'" in details
        # Submitted before the binding: its trial waits, and the queue says why.
        t.api["attacker"].ExperimentAction(
            api_pb2.ExperimentActionRequest(id=waiting, action=api_pb2.EXPERIMENT_ACTION_ACTIVATE)
        )
        t.agents["shared"].nothing(0.5)
        queue = t.api["attacker"].GetQueue(api_pb2.GetQueueRequest()).trials
        [queued] = [q for q in queue if q.experiment_id == waiting]
        assert "pool 'shared' is bound to workspace 'victims'" in queued.reason
        # The victims' experiment is placed there.
        theirs = t.create("victim", workspace="victims", project="p", **shared)
        assert t.agents["shared"].next("start").start.trial_id == store.list_trials(theirs)[0].id
        t.end(theirs, "shared")
    finally:
        unbound = t.site.api.UnbindResourcePool(
            api_pb2.UnbindResourcePoolRequest(pool="shared", workspace="victims")
        )
    assert list(unbound.bindings) == []
    # Open to all again: the held-back trial starts.
    start = t.agents["shared"].next("start").start
    assert start.trial_id == store.list_trials(waiting)[0].id
    t.end(waiting, "shared")
    # The settings' binding cannot be removed at run time.
    code, details = _code(
        lambda: t.site.api.UnbindResourcePool(
            api_pb2.UnbindResourcePoolRequest(pool="gpu", workspace="victims")
        )
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "master's settings" in details


def test_a_workspace_named_by_the_settings_is_kept(tenants: Tenants, tmp_path: Path) -> None:
    """Made at start with no members, so no user claims the name; not deleted while the
    settings name it."""
    code, details = _code(
        lambda: tenants.site.api.DeleteWorkspace(api_pb2.DeleteWorkspaceRequest(name="victims"))
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "bound to resource pool(s) gpu by the master's settings" in details
