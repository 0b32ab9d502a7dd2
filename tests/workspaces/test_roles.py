"""The role matrix on every RPC of the Api service and every HTTP route, generated from the
service descriptor and the route table, against one real master (gRPC and HTTP on
loopback).

Four users meet workspace "team": otto is no member (NOT_FOUND, as for an id that does
not exist), vera a viewer, eddie an editor, ada an admin. Each RPC that names something in
a workspace is called by each of them: below the RPC's role it is refused
(PERMISSION_DENIED), at or above it passes the role check.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from assay.master.api import ROUTES
from assay.master.store import CheckpointRecord
from assay.proto import api_pb2, api_pb2_grpc
from tests.credentials import authed_api, login
from tests.http.conftest import Site, open_site
from tests.master.conftest import experiment_yaml, model_archive

USERS = {"otto": None, "vera": "viewer", "eddie": "editor", "ada": "admin"}
RANK = {None: -1, "viewer": 0, "editor": 1, "admin": 2}
PASSWORD = "pw-of-the-team-1"

# RPCs that name nothing in a workspace: open to any logged-in user (lists are filtered
# to the caller's workspaces), for cluster admins only, or (Login) to anyone.
ANY_USER = {
    "GetMasterInfo",
    "Logout",
    "WhoAmI",
    "ListUsers",
    "ChangePassword",  # one's own; another's: cluster admins (tested in tests/master)
    "GetUsage",  # one's own usage; cluster admins everyone's
    "ListAgents",
    "ListResourcePools",
    "ListResourcePoolWorkspaces",  # which workspaces may use a pool: told to all
    "ListExperiments",  # filtered: test_lists_show_only_the_callers_workspaces
    "GetQueue",  # filtered likewise
    "ListWorkspaces",  # filtered likewise
    "ListProjects",  # without a workspace: filtered likewise
    "CreateWorkspace",  # its creator becomes its admin
    # The model registry: any user reads it; a model is changed by its owner, editors of
    # its workspace or an admin (tests/registry, tests/security/test_registry_tenants);
    # registering a checkpoint needs a role (below).
    # Experiment templates: any user reads and creates; the creator or an admin deletes.
    "CreateTemplate",
    "GetTemplate",
    "ListTemplates",
    "DeleteTemplate",
    "CreateModel",
    "GetModel",
    "ListModels",
    "PatchModel",
    "ArchiveModel",
    "UnarchiveModel",
    "DeleteModel",
    "ListModelVersions",
    "GetModelVersion",
    "PatchModelVersion",
    "DeleteModelVersion",
}
PUBLIC = {"Login"}
CLUSTER_ADMIN = {
    "CreateUser",
    "SetUserActive",
    "RemoveAgent",
    "SetAgentEnabled",
    "BindResourcePool",
    "UnbindResourcePool",
    "GetMasterConfig",
    "StreamMasterLogs",
}


@dataclass
class Team:
    site: Site
    stubs: dict[str, api_pb2_grpc.ApiStub]
    tokens: dict[str, str]
    experiment_id: int
    trial_id: int
    checkpoint: str
    default_experiment: int
    channels: list[grpc.Channel]


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    site = open_site(tmp_path_factory.mktemp("roles") / "master")
    master = site.master
    address = f"127.0.0.1:{master.port}"
    for name in [*USERS, "tmp"]:
        master.auth.create_user(name, PASSWORD)
    site.api.CreateWorkspace(api_pb2.CreateWorkspaceRequest(name="team"))
    for name, role in USERS.items():
        if role is not None:
            site.api.SetWorkspaceMember(
                api_pb2.SetWorkspaceMemberRequest(workspace="team", username=name, role=role)
            )
    site.api.CreateProject(api_pb2.CreateProjectRequest(workspace="team", name="p1"))
    eid = site.create(activate=False, workspace="team", project="p1")
    default_eid = site.create(activate=False)
    store = master.store
    [trial] = store.list_trials(eid)
    checkpoint = str(uuid.uuid4())
    store.add_checkpoint(
        CheckpointRecord(checkpoint, trial.id, 0, 1, "COMPLETED", "/nowhere", {"m.pt": 1})
    )
    site.api.CreateModel(api_pb2.CreateModelRequest(name="m1", workspace="team"))
    stubs, tokens, channels = {}, {}, []
    for name in USERS:
        tokens[name] = login(address, name, PASSWORD)
        stubs[name], channel = authed_api(address, tokens[name])
        channels.append(channel)
    yield Team(site, stubs, tokens, eid, trial.id, checkpoint, default_eid, channels)
    for channel in channels:
        channel.close()
    site.close()


_names = itertools.count()


def _requests(t: Team) -> dict[str, tuple[str, Callable[[], Any]]]:
    """RPC -> (the role it needs in "team", a request that passes every other check)."""
    store = t.site.master.store
    team_id = store.get_workspace("team").id
    tmp_id = store.get_user("tmp").id
    eid, tid = t.experiment_id, t.trial_id

    def removable() -> api_pb2.RemoveWorkspaceMemberRequest:
        store.set_member(team_id, tmp_id, "viewer")
        return api_pb2.RemoveWorkspaceMemberRequest(workspace="team", username="tmp")

    def fresh_trial() -> api_pb2.KillTrialRequest:
        """A trial of a new paused experiment of "team", for each kill to have its own."""
        [trial] = store.list_trials(t.site.create(activate=False, workspace="team", project="p1"))
        return api_pb2.KillTrialRequest(id=trial.id)

    def chunks() -> Iterator[api_pb2.CreateExperimentChunk]:
        yield api_pb2.CreateExperimentChunk(
            config_yaml=experiment_yaml(workspace="team", project="p1"),
            model_definition_part=model_archive(),
        )

    return {
        "GetExperiment": ("viewer", lambda: api_pb2.GetExperimentRequest(id=eid)),
        "GetExperimentMetrics": (
            "viewer",
            lambda: api_pb2.GetExperimentMetricsRequest(id=eid, name="loss"),
        ),
        "GetModelDefinition": (
            "viewer",
            lambda: api_pb2.GetModelDefinitionRequest(experiment_id=eid),
        ),
        "GetTrial": ("viewer", lambda: api_pb2.GetTrialRequest(id=tid)),
        "GetTrialMetrics": ("viewer", lambda: api_pb2.GetTrialMetricsRequest(id=tid)),
        "StreamTrialLogs": ("viewer", lambda: api_pb2.StreamTrialLogsRequest(trial_id=tid)),
        "ListCheckpoints": ("viewer", lambda: api_pb2.ListCheckpointsRequest(experiment_id=eid)),
        "GetCheckpoint": ("viewer", lambda: api_pb2.GetCheckpointRequest(uuid=t.checkpoint)),
        # As deleting the checkpoint: a version keeps it (m1 is a model of "team").
        "RegisterModelVersion": (
            "editor",
            lambda: api_pb2.RegisterModelVersionRequest(name="m1", checkpoint_uuid=t.checkpoint),
        ),
        "GetWorkspace": ("viewer", lambda: api_pb2.GetWorkspaceRequest(name="team")),
        "ListWorkspaceMembers": (
            "viewer",
            lambda: api_pb2.ListWorkspaceMembersRequest(workspace="team"),
        ),
        "GetProject": ("viewer", lambda: api_pb2.GetProjectRequest(workspace="team", name="p1")),
        "CreateExperiment": (
            "editor",
            lambda: api_pb2.CreateExperimentRequest(
                config_yaml=experiment_yaml(workspace="team", project="p1"),
                model_definition=model_archive(),
            ),
        ),
        "CreateExperimentStream": ("editor", chunks),
        "ExperimentAction": (
            "editor",
            lambda: api_pb2.ExperimentActionRequest(id=eid, action=api_pb2.EXPERIMENT_ACTION_PAUSE),
        ),
        "SetExperimentResource": (
            "editor",
            lambda: api_pb2.SetExperimentResourceRequest(id=eid, name="priority", value="42"),
        ),
        "MoveExperiment": ("editor", lambda: api_pb2.MoveExperimentRequest(id=eid, project="p1")),
        # A custom search's runner steers the experiment: editors, as for pausing it (this
        # experiment's searcher is single: past the role check, the call is refused).
        "GetSearcherEvents": (
            "editor",
            lambda: api_pb2.GetSearcherEventsRequest(experiment_id=eid),
        ),
        "PostSearcherOperations": (
            "editor",
            lambda: api_pb2.PostSearcherOperationsRequest(
                experiment_id=eid,
                triggered_by_event_id=1,
                operations=[api_pb2.SearcherOperation(shutdown=api_pb2.ShutdownOperation())],
            ),
        ),
        "PatchExperiment": (
            "editor",
            lambda: api_pb2.PatchExperimentRequest(id=eid, add_labels=["reviewed"]),
        ),
        "KillTrial": ("editor", fresh_trial),
        # The experiment is paused: past the role check, continuing it is refused.
        "ContinueExperiment": ("editor", lambda: api_pb2.ContinueExperimentRequest(id=eid)),
        # The experiment is paused: past the role check, its deletion is refused.
        "DeleteExperiment": ("editor", lambda: api_pb2.DeleteExperimentRequest(id=eid)),
        "CreateProject": (
            "editor",
            lambda: api_pb2.CreateProjectRequest(workspace="team", name=f"p-{next(_names)}"),
        ),
        "DeleteCheckpoints": (
            "editor",  # or its experiment's owner with any role (test_delete_roles)
            lambda: api_pb2.DeleteCheckpointsRequest(uuids=[t.checkpoint]),
        ),
        "ArchiveWorkspace": (
            "admin",
            lambda: api_pb2.ArchiveWorkspaceRequest(name="team", archived=False),
        ),
        "DeleteWorkspace": ("admin", lambda: api_pb2.DeleteWorkspaceRequest(name="team")),
        "SetWorkspaceMember": (
            "admin",
            lambda: api_pb2.SetWorkspaceMemberRequest(
                workspace="team", username="vera", role="viewer"
            ),
        ),
        "RemoveWorkspaceMember": ("admin", removable),
        "ArchiveProject": (
            "admin",
            lambda: api_pb2.ArchiveProjectRequest(workspace="team", name="p1", archived=False),
        ),
        "DeleteProject": (
            "admin",
            lambda: api_pb2.DeleteProjectRequest(workspace="team", name="p1"),
        ),
    }


# For an unknown workspace a submission is a config error that names the user's choices.
NON_MEMBER = {
    "CreateExperiment": grpc.StatusCode.INVALID_ARGUMENT,
    "CreateExperimentStream": grpc.StatusCode.INVALID_ARGUMENT,
}
# Refused to members for another reason than their role (none now: deleting a
# checkpoint is for editors of its workspace, as deleting its experiment is).
OWNER_ONLY: set[str] = set()


def _call(stub: api_pb2_grpc.ApiStub, rpc: str, request: Any, token: str = "") -> grpc.StatusCode:
    method = getattr(stub, rpc)
    try:
        if rpc == "CreateExperimentStream":  # the test channel adds tokens to unary calls only
            method(request, timeout=10, metadata=(("authorization", f"Bearer {token}"),))
        elif rpc in ("StreamTrialLogs", "StreamMasterLogs"):
            list(method(request, timeout=10))
        else:
            method(request, timeout=10)
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def test_every_rpc_is_in_the_matrix(team: Team) -> None:
    service = api_pb2.DESCRIPTOR.services_by_name["Api"]
    scoped = set(_requests(team))
    classified = scoped | ANY_USER | PUBLIC | CLUSTER_ADMIN
    assert {m.name for m in service.methods} == classified
    assert not scoped & (ANY_USER | PUBLIC | CLUSTER_ADMIN)


def test_each_role_may_do_what_its_rank_allows(team: Team) -> None:
    failures = []
    for rpc, (need, build) in _requests(team).items():
        for user, role in USERS.items():
            got = _call(team.stubs[user], rpc, build(), team.tokens[user])
            if role is None:
                expected = {NON_MEMBER.get(rpc, grpc.StatusCode.NOT_FOUND)}
                ok = got in expected
            elif rpc in OWNER_ONLY or RANK[role] < RANK[need]:
                ok = got == grpc.StatusCode.PERMISSION_DENIED
            else:  # passed the role check: done, or refused for another reason
                ok = got not in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND)
            if not ok:
                failures.append(f"{rpc} as {user} ({role}): {got.name}")
    assert failures == []
    # The refused calls changed nothing: the experiment is where it was, still paused.
    record = team.site.master.store.get_experiment(team.experiment_id)
    assert (record.workspace, record.project, record.state) == ("team", "p1", "PAUSED")
    assert team.site.master.store.get_workspace("team").archived is False


def test_cluster_admins_only(team: Team) -> None:
    requests = {
        "CreateUser": api_pb2.CreateUserRequest(username="eve", password="x" * 12),
        "SetUserActive": api_pb2.SetUserActiveRequest(username="admin"),
        "RemoveAgent": api_pb2.RemoveAgentRequest(id="a"),
        "SetAgentEnabled": api_pb2.SetAgentEnabledRequest(id="a", enabled=False),
        "BindResourcePool": api_pb2.BindResourcePoolRequest(pool="default", workspace="team"),
        "UnbindResourcePool": api_pb2.UnbindResourcePoolRequest(pool="default", workspace="team"),
        "GetMasterConfig": api_pb2.GetMasterConfigRequest(),
        "StreamMasterLogs": api_pb2.StreamMasterLogsRequest(tail=5),
    }
    assert set(requests) == CLUSTER_ADMIN
    for rpc, request in requests.items():
        for user in USERS:  # a workspace admin is no cluster admin
            assert _call(team.stubs[user], rpc, request) == grpc.StatusCode.PERMISSION_DENIED


def test_lists_show_only_the_callers_workspaces(team: Team) -> None:
    def listed(user: str) -> set[int]:
        found = team.stubs[user].ListExperiments(api_pb2.ListExperimentsRequest(limit=1000))
        return {e.id for e in found.experiments}

    assert team.experiment_id not in listed("otto")
    assert team.default_experiment in listed("otto")  # otto is an editor of Default
    assert team.experiment_id in listed("vera")
    names = {
        w.name
        for w in team.stubs["otto"].ListWorkspaces(api_pb2.ListWorkspacesRequest()).workspaces
    }
    assert names == {"Default"}
    projects = team.stubs["otto"].ListProjects(api_pb2.ListProjectsRequest()).projects
    assert {p.workspace for p in projects} == {"Default"}
    roles = {
        w.name: w.role
        for w in team.stubs["vera"].ListWorkspaces(api_pb2.ListWorkspacesRequest()).workspaces
    }
    assert roles == {"Default": "editor", "team": "viewer"}
    only = team.stubs["vera"].ListExperiments(
        api_pb2.ListExperimentsRequest(workspace="team", project="p1")
    )
    assert {e.id for e in only.experiments} >= {team.experiment_id}
    assert all((e.workspace, e.project) == ("team", "p1") for e in only.experiments)


# What an editor of the shared Default workspace may not do to another user's experiment
# (there only its owner and admins steer, change or delete it, its trials and checkpoints).
DEFAULT_OWNERS_ONLY = {
    "ExperimentAction",
    "SetExperimentResource",
    "MoveExperiment",
    "GetSearcherEvents",
    "PostSearcherOperations",
    "PatchExperiment",
    "KillTrial",
    "ContinueExperiment",
    "DeleteExperiment",
    "DeleteCheckpoints",
    "RegisterModelVersion",  # a version would keep the checkpoint from its owner's deletion
}


def test_in_default_an_editor_steers_only_their_own_experiments(team: Team) -> None:
    """otto is an editor of Default: admin's experiment there he reads but may not steer,
    change or delete (nor its trial and checkpoint); his own he steers."""
    store = team.site.master.store
    [trial] = store.list_trials(team.default_experiment)
    checkpoint = str(uuid.uuid4())
    store.add_checkpoint(
        CheckpointRecord(checkpoint, trial.id, 0, 1, "COMPLETED", "/nowhere", {"m.pt": 1})
    )
    default = dataclasses.replace(
        team, experiment_id=team.default_experiment, trial_id=trial.id, checkpoint=checkpoint
    )
    requests = _requests(default)
    steering = {rpc for rpc, (need, _) in requests.items() if need == "editor"}
    assert steering - {"CreateExperiment", "CreateExperimentStream", "CreateProject"} == (
        DEFAULT_OWNERS_ONLY
    )
    otto = team.stubs["otto"]
    failures = []
    for rpc in sorted(DEFAULT_OWNERS_ONLY):
        request = requests[rpc][1]()
        if rpc == "KillTrial":
            request = api_pb2.KillTrialRequest(id=trial.id)
        try:
            getattr(otto, rpc)(request, timeout=10)
            failures.append(f"{rpc}: passed")
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.PERMISSION_DENIED or "belongs to admin" not in str(
                e.details()
            ):
                failures.append(f"{rpc}: {e.code().name} {e.details()}")
    assert failures == []
    assert _call(otto, "GetExperiment", api_pb2.GetExperimentRequest(id=default.experiment_id)) == (
        grpc.StatusCode.OK
    )
    assert store.get_checkpoint(checkpoint).state == "COMPLETED"
    own = otto.CreateExperiment(
        api_pb2.CreateExperimentRequest(
            config_yaml=experiment_yaml(), model_definition=model_archive()
        )
    ).experiment.id
    for rpc, request in (
        (
            "SetExperimentResource",
            api_pb2.SetExperimentResourceRequest(id=own, name="weight", value="2"),
        ),
        (
            "ExperimentAction",
            api_pb2.ExperimentActionRequest(id=own, action=api_pb2.EXPERIMENT_ACTION_KILL),
        ),
    ):
        assert _call(otto, rpc, request) == grpc.StatusCode.OK, rpc


def _fill(path: str, t: Team) -> str:
    values = {
        "{id}": str(t.experiment_id),
        "{trial_id}": str(t.trial_id),
        "{uuid}": t.checkpoint,
        "{workspace}": "team",
        "{username}": "tmp",
        "{action}": "pause",
        "{version}": "1",
    }
    for key, value in values.items():
        path = path.replace(key, value)
    if "/projects/{name}" in path:
        return path.replace("{name}", "p1")
    if "/set/{name}" in path:
        return path.replace("{name}", "priority")
    if path.startswith("/api/v1/models/"):
        return path.replace("{name}", "m1")
    return path.replace("{name}", "team")


def _http(t: Team, user: str, method: str, path: str, body: dict[str, Any]) -> int:
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if method == "POST" else None
    headers = {"Authorization": f"Bearer {t.tokens[user]}", "Content-Type": "application/json"}
    request = urllib.request.Request(t.site.base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as e:
        with e:
            return int(e.code)


def test_every_route_of_a_workspace_rpc_applies_the_matrix(team: Team) -> None:
    """Over HTTP: outsiders get 404, members below the route's role 403."""
    requests = _requests(team)
    covered = set()
    failures = []
    for route in ROUTES:
        if route.rpc not in requests:
            continue
        need, build = requests[route.rpc]
        request = build()
        if route.rpc == "CreateExperimentStream":
            continue
        fields = json_format.MessageToDict(request, preserving_proto_field_name=True)
        rest = {k: v for k, v in fields.items() if k not in route.taken}
        body = rest if route.body else {}
        path = _fill(route.url, team)
        if route.method == "GET" and rest:
            path += "?" + urllib.parse.urlencode(rest)
        for user, role in USERS.items():
            if role is not None and RANK[role] >= RANK[need]:
                continue
            status = _http(team, user, route.method, path, body)
            if role is None:
                code = NON_MEMBER.get(route.rpc, grpc.StatusCode.NOT_FOUND)
                expected = 400 if code == grpc.StatusCode.INVALID_ARGUMENT else 404
            else:
                expected = 403
            if status != expected:
                failures.append(f"{route.method} {path} as {user}: {status}, not {expected}")
        covered.add(route.rpc)
    assert failures == []
    routed = {r.rpc for r in ROUTES}
    assert covered == set(requests) & routed - {"CreateExperimentStream"}


def test_a_workspace_admin_manages_members_and_a_role_change_applies_at_once(
    team: Team, tmp_path: Path
) -> None:
    ada, vera = team.stubs["ada"], team.stubs["vera"]
    steer = api_pb2.SetExperimentResourceRequest(id=team.experiment_id, name="priority", value="7")
    assert _call(vera, "SetExperimentResource", steer) == grpc.StatusCode.PERMISSION_DENIED
    ada.SetWorkspaceMember(
        api_pb2.SetWorkspaceMemberRequest(workspace="team", username="vera", role="editor")
    )
    assert _call(vera, "SetExperimentResource", steer) == grpc.StatusCode.OK
    ada.RemoveWorkspaceMember(
        api_pb2.RemoveWorkspaceMemberRequest(workspace="team", username="vera")
    )
    got = _call(vera, "GetExperiment", api_pb2.GetExperimentRequest(id=team.experiment_id))
    assert got == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as caught:
        ada.SetWorkspaceMember(
            api_pb2.SetWorkspaceMemberRequest(workspace="team", username="vera", role="owner")
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "viewer, editor, admin" in str(caught.value.details())
    ada.SetWorkspaceMember(
        api_pb2.SetWorkspaceMemberRequest(workspace="team", username="vera", role="viewer")
    )


def test_a_fork_reads_its_model_definition_with_the_sources_read_role(team: Team) -> None:
    """CreateExperiment with `model_definition_from` (the web UI's Fork): a viewer of the
    source may fork it into a workspace where they are an editor; to anyone else the
    source does not exist."""
    fork = api_pb2.CreateExperimentRequest(
        config_yaml=experiment_yaml(), model_definition_from=team.experiment_id
    )
    assert _call(team.stubs["otto"], "CreateExperiment", fork) == grpc.StatusCode.NOT_FOUND
    created = team.stubs["vera"].CreateExperiment(fork).experiment
    try:
        source = api_pb2.GetModelDefinitionRequest(experiment_id=team.experiment_id)
        copy = api_pb2.GetModelDefinitionRequest(experiment_id=created.id)
        api = team.site.api
        assert api.GetModelDefinition(copy) == api.GetModelDefinition(source)
        assert created.workspace == "Default"
    finally:
        api_kill = api_pb2.ExperimentActionRequest(
            id=created.id, action=api_pb2.EXPERIMENT_ACTION_KILL
        )
        team.site.api.ExperimentAction(api_kill)
    both = api_pb2.CreateExperimentRequest(
        config_yaml=experiment_yaml(),
        model_definition=model_archive(),
        model_definition_from=team.experiment_id,
    )
    assert _call(team.stubs["vera"], "CreateExperiment", both) == grpc.StatusCode.INVALID_ARGUMENT


def test_a_model_version_shows_its_checkpoint_only_to_who_may_read_it(team: Team) -> None:
    """The registry is read by every user, but a version's checkpoint (its experiment,
    trial, location, files and metrics) only by its workspace's members: to others the
    version names the checkpoint's uuid alone, as the checkpoint itself does not exist."""
    ada, otto, vera = team.stubs["ada"], team.stubs["otto"], team.stubs["vera"]
    ada.CreateModel(api_pb2.CreateModelRequest(name="shown-to-members"))
    ada.RegisterModelVersion(
        api_pb2.RegisterModelVersionRequest(
            name="shown-to-members", checkpoint_uuid=team.checkpoint
        )
    )
    get = api_pb2.GetModelVersionRequest(name="shown-to-members", version=1)
    listing = api_pb2.ListModelVersionsRequest(name="shown-to-members")
    for version in (otto.GetModelVersion(get), otto.ListModelVersions(listing).versions[0]):
        assert version.checkpoint_uuid == team.checkpoint
        assert not version.HasField("checkpoint")
    for version in (vera.GetModelVersion(get), vera.ListModelVersions(listing).versions[0]):
        assert version.checkpoint.experiment_id == team.experiment_id
        assert version.checkpoint.location == "/nowhere"
    # A model's owner who is no member of the checkpoint's workspace: its reply to a
    # change of the version holds no more than its reads.
    otto.CreateModel(api_pb2.CreateModelRequest(name="ottos"))
    team.site.api.RegisterModelVersion(
        api_pb2.RegisterModelVersionRequest(name="ottos", checkpoint_uuid=team.checkpoint)
    )
    patched = otto.PatchModelVersion(
        api_pb2.PatchModelVersionRequest(name="ottos", version=1, notes="mine")
    )
    assert patched.notes == "mine"
    assert not patched.HasField("checkpoint")
