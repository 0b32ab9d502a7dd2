"""Who deletes an experiment or its checkpoints and who kills a trial, on one real
master: editors of the workspace (admins too), and for deletion the experiment's owner
whatever their role now; a viewer is refused naming the role, a non-member is told the
experiment does not exist."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from assay.master.errors import ConflictError
from assay.master.store import CheckpointRecord
from assay.proto import api_pb2, api_pb2_grpc, common_pb2
from tests.credentials import authed_api, login
from tests.http.conftest import Site, open_site
from tests.master.conftest import experiment_yaml, model_archive

PASSWORD = "pw-of-the-crew-1"
ROLES = {"owen": "editor", "vera": "viewer", "eddie": "editor"}  # otto: no member


@pytest.fixture
def crew(tmp_path: Path) -> Iterator[tuple[Site, dict[str, api_pb2_grpc.ApiStub]]]:
    site = open_site(tmp_path / "master")
    address = f"127.0.0.1:{site.master.port}"
    site.api.CreateWorkspace(api_pb2.CreateWorkspaceRequest(name="crew"))
    site.api.CreateProject(api_pb2.CreateProjectRequest(workspace="crew", name="p"))
    stubs, channels = {}, []
    for name in [*ROLES, "otto"]:
        site.master.auth.create_user(name, PASSWORD)
        if name in ROLES:
            member = api_pb2.SetWorkspaceMemberRequest(
                workspace="crew", username=name, role=ROLES[name]
            )
            site.api.SetWorkspaceMember(member)
        stubs[name], channel = authed_api(address, login(address, name, PASSWORD))
        channels.append(channel)
    try:
        yield site, stubs
    finally:
        for channel in channels:
            channel.close()
        site.close()


def _code(call: Callable[[], object]) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def _ended(site: Site, stub: api_pb2_grpc.ApiStub) -> tuple[int, int]:
    """A killed experiment of crew created by `stub`'s user, and its trial."""
    created = stub.CreateExperiment(
        api_pb2.CreateExperimentRequest(
            config_yaml=experiment_yaml(workspace="crew", project="p"),
            model_definition=model_archive(),
        )
    ).experiment
    kill = api_pb2.ExperimentActionRequest(id=created.id, action=api_pb2.EXPERIMENT_ACTION_KILL)
    site.api.ExperimentAction(kill)
    [trial] = site.master.store.list_trials(created.id)
    return created.id, trial.id


def test_the_owner_deletes_with_any_role_editors_always_viewers_never(
    crew: tuple[Site, dict[str, api_pb2_grpc.ApiStub]],
) -> None:
    site, stubs = crew
    mine, trial = _ended(site, stubs["owen"])
    store = site.master.store
    checkpoint = str(uuid.uuid4())
    store.add_checkpoint(CheckpointRecord(checkpoint, trial, 0, 1, "COMPLETED", "/x", {"m": 1}))
    demote = api_pb2.SetWorkspaceMemberRequest(workspace="crew", username="owen", role="viewer")
    site.api.SetWorkspaceMember(demote)

    delete = api_pb2.DeleteExperimentRequest(id=mine)
    checkpoints = api_pb2.DeleteCheckpointsRequest(uuids=[checkpoint])
    with pytest.raises(grpc.RpcError) as outsider:
        stubs["otto"].DeleteExperiment(delete)
    assert outsider.value.code() == grpc.StatusCode.NOT_FOUND
    assert outsider.value.details() == f"experiment {mine} does not exist"
    with pytest.raises(grpc.RpcError) as viewer:
        stubs["vera"].DeleteExperiment(delete)
    assert viewer.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "vera is a viewer of workspace 'crew'" in (viewer.value.details() or "")
    assert "needs the editor role" in (viewer.value.details() or "")
    assert _code(lambda: stubs["otto"].DeleteCheckpoints(checkpoints)) == grpc.StatusCode.NOT_FOUND
    vera = _code(lambda: stubs["vera"].DeleteCheckpoints(checkpoints))
    assert vera == grpc.StatusCode.PERMISSION_DENIED
    assert store.get_experiment(mine).state == "CANCELED"  # the refusals changed nothing

    # Owen is only a viewer now, but the experiment and its checkpoints are his.
    assert _code(lambda: stubs["owen"].DeleteCheckpoints(checkpoints)) == grpc.StatusCode.OK
    assert list(stubs["owen"].DeleteExperiment(delete).deleted_checkpoints) == []
    assert _code(lambda: site.api.GetExperiment(api_pb2.GetExperimentRequest(id=mine))) == (
        grpc.StatusCode.NOT_FOUND
    )

    # Not his: an editor deletes it; the owner-as-viewer may not kill a trial (editors do).
    theirs, _ = _ended(site, stubs["eddie"])
    other = api_pb2.DeleteExperimentRequest(id=theirs)
    assert _code(lambda: stubs["owen"].DeleteExperiment(other)) == grpc.StatusCode.PERMISSION_DENIED
    live = site.create(activate=False, workspace="crew", project="p")
    [live_trial] = store.list_trials(live)
    kill = api_pb2.KillTrialRequest(id=live_trial.id)
    assert _code(lambda: stubs["otto"].KillTrial(kill)) == grpc.StatusCode.NOT_FOUND
    assert _code(lambda: stubs["owen"].KillTrial(kill)) == grpc.StatusCode.PERMISSION_DENIED
    assert store.get_trial(live_trial.id).state == "PAUSED"
    assert stubs["eddie"].KillTrial(kill).state == common_pb2.TRIAL_STATE_CANCELED
    assert stubs["eddie"].DeleteExperiment(other) is not None
    assert store.get_experiment(live).state == "PAUSED"  # its other trials would go on
    # The rows go under the master's lock, refused for an experiment live in memory (one
    # an `experiment continue` brought back after the files went).
    with pytest.raises(ConflictError, match=f"experiment {live} is PAUSED again"):
        site.master.master.delete_experiment_rows(live)
    assert store.get_experiment(live).state == "PAUSED"
