"""Tenants of the model registry, on one real master per database (SQLite and PostgreSQL).

vicky (the victim) and mallory (the attacker) each have a workspace of their own;
mallory also reads vicky's ("victims", as a viewer), eddie is an editor there, otto is a
member of neither, and the cluster's admin may do everything. mallory may not publish a
version of vicky's model, nor change its labels, metadata or versions; she may not
register vicky's checkpoint (which would keep it from deletion); a version that pins a
checkpoint from another workspace never stops its owner deleting it, and then says the
checkpoint is gone; loading a version whose code another user uploaded runs it only with
`trust=True`. The owner, an editor of the model's workspace and the admin may.
"""

from __future__ import annotations

import json
import uuid as uuidlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from assay.client import Client, Session, UntrustedCodeError
from assay.common.storage import checkpoint_location
from assay.config import parse_config
from assay.errors import AssayError
from assay.master.store import CheckpointRecord
from assay.proto import api_pb2, api_pb2_grpc
from tests.credentials import authed_api, login
from tests.http.conftest import Site, open_site
from tests.master.conftest import experiment_yaml, model_archive
from tests.store.conftest import _empty_postgres, postgres_url  # noqa: F401 - a fixture

PASSWORD = "pw-of-a-tenant-1"
# Each user's role in each workspace ("victims" and "mallorys" are made by their owners).
ROLES = {
    "victims": {"mallory": "viewer", "eddie": "editor"},
    "team": {"vicky": "editor", "mallory": "editor"},
}


@dataclass
class Tenants:
    site: Site
    stubs: dict[str, api_pb2_grpc.ApiStub]
    tokens: dict[str, str]
    channels: list[grpc.Channel] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.site.master.port}"


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def tenants(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Tenants]:
    settings: dict[str, Any] = {}
    if request.param == "postgresql":
        settings["db_url"] = request.getfixturevalue("postgres_url")
        _empty_postgres(settings["db_url"])
    site = open_site(tmp_path_factory.mktemp(f"registry-{request.param}") / "master", **settings)
    found = Tenants(site, {}, {})
    try:
        for name in ("vicky", "mallory", "eddie", "otto"):
            site.master.auth.create_user(name, PASSWORD)
            found.tokens[name] = login(found.address, name, PASSWORD)
            found.stubs[name], channel = authed_api(found.address, found.tokens[name])
            found.channels.append(channel)
        found.stubs["admin"] = site.api
        for owner, workspace in (("vicky", "victims"), ("mallory", "mallorys"), ("admin", "team")):
            stub = found.stubs[owner]
            stub.CreateWorkspace(api_pb2.CreateWorkspaceRequest(name=workspace))
            stub.CreateProject(api_pb2.CreateProjectRequest(workspace=workspace, name="p"))
        for workspace, members in ROLES.items():
            for name, role in members.items():
                site.api.SetWorkspaceMember(
                    api_pb2.SetWorkspaceMemberRequest(workspace=workspace, username=name, role=role)
                )
        yield found
    finally:
        for channel in found.channels:
            channel.close()
        site.close()


_names = iter(range(1, 10_000))


def _ended(t: Tenants, user: str, workspace: str, files: dict[str, str] | None = None) -> int:
    """A new killed experiment of `user` in `workspace`/p (its model definition: `files`)."""
    name = next(_names)
    entrypoint = f"{next(iter(files)).removesuffix('.py')}:T" if files else "model_def:T"
    created = (
        t.stubs[user]
        .CreateExperiment(
            api_pb2.CreateExperimentRequest(
                config_yaml=experiment_yaml(
                    name=f"exp-{name}", workspace=workspace, project="p", entrypoint=entrypoint
                ),
                model_definition=model_archive(files),
                activate=False,
            )
        )
        .experiment
    )
    kill = api_pb2.ExperimentActionRequest(id=created.id, action=api_pb2.EXPERIMENT_ACTION_KILL)
    t.site.api.ExperimentAction(kill)
    return int(created.id)


def _checkpoint(t: Tenants, experiment_id: int) -> str:
    """A checkpoint of the experiment's trial whose files are where its storage keeps them."""
    store = t.site.master.store
    [trial] = store.list_trials(experiment_id)
    uuid = str(uuidlib.uuid4())
    config = parse_config(store.get_experiment(experiment_id).config).checkpoint_storage
    root = t.site.master.config.checkpoint_root
    location = checkpoint_location(config, uuid, root, experiment_id=experiment_id)
    Path(location).mkdir(parents=True)
    (Path(location) / "model.pt").write_bytes(b"w" * 10)
    store.add_checkpoint(
        CheckpointRecord(uuid, trial.id, trial.run_id, 10, "COMPLETED", location, {"model.pt": 10})
    )
    return uuid


def _model(t: Tenants, owner: str, workspace: str = "") -> str:
    name = f"{owner}-model-{next(_names)}"
    request = api_pb2.CreateModelRequest(name=name, labels=["prod"], workspace=workspace)
    t.stubs[owner].CreateModel(request)
    return name


def _register(t: Tenants, user: str, model: str, uuid: str) -> int:
    request = api_pb2.RegisterModelVersionRequest(name=model, checkpoint_uuid=uuid)
    return int(t.stubs[user].RegisterModelVersion(request).version)


def _refused(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def _version(t: Tenants, user: str, model: str, version: int = 0) -> api_pb2.ModelVersion:
    request = api_pb2.GetModelVersionRequest(name=model, version=version)
    found: api_pb2.ModelVersion = t.stubs[user].GetModelVersion(request)
    return found


def test_a_stranger_cannot_publish_a_version_of_anothers_model(tenants: Tenants) -> None:
    t = tenants
    model = _model(t, "vicky", "victims")
    _register(t, "vicky", model, _checkpoint(t, _ended(t, "vicky", "victims")))
    own = _checkpoint(t, _ended(t, "mallory", "mallorys"))

    refused = _refused(lambda: _register(t, "mallory", model, own))
    assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
    assert refused.details() == (
        f"model {model!r} belongs to vicky: only they, editors of its workspace 'victims' "
        "and administrators may add versions to it (mallory may not); register your "
        "checkpoint in a model of your own (`assay model create`)"
    )
    reply = t.site.post(
        f"/api/v1/models/{model}/versions",
        json.dumps({"checkpoint_uuid": own}).encode(),
        headers={"Authorization": f"Bearer {t.tokens['mallory']}"},
        auth=False,
    )
    assert reply.status == 403
    # What vicky downloads or loads is still her own version.
    latest = _version(t, "vicky", model)
    assert (latest.version, latest.user, latest.code_owner) == (1, "vicky", "vicky")


def test_a_stranger_cannot_change_labels_metadata_or_versions(tenants: Tenants) -> None:
    t = tenants
    model = _model(t, "vicky", "victims")
    _register(t, "vicky", model, _checkpoint(t, _ended(t, "vicky", "victims")))
    before = t.stubs["vicky"].GetModel(api_pb2.GetModelRequest(name=model))
    labels = api_pb2.LabelList(labels=["pwned"])
    patch_version = api_pb2.PatchModelVersionRequest(name=model, version=1, labels=labels)
    patch_version.metadata.update({"weights": "mine"})
    patch_model = api_pb2.PatchModelRequest(name=model, labels=labels)
    patch_model.metadata.update({"owner": "mallory"})
    attacks: dict[str, Any] = {
        "PatchModel": patch_model,
        "ArchiveModel": api_pb2.ArchiveModelRequest(name=model),
        "UnarchiveModel": api_pb2.UnarchiveModelRequest(name=model),
        "DeleteModel": api_pb2.DeleteModelRequest(name=model, force=True),
        "PatchModelVersion": patch_version,
        "DeleteModelVersion": api_pb2.DeleteModelVersionRequest(name=model, version=1),
    }
    for user in ("mallory", "otto"):  # a reader of its workspace, and a stranger
        for rpc, request in attacks.items():
            refused = _refused(lambda: getattr(t.stubs[user], rpc)(request))  # noqa: B023
            assert refused.code() == grpc.StatusCode.PERMISSION_DENIED, (user, rpc)
            assert f"model {model!r} belongs to vicky" in (refused.details() or "")
            assert f"({user} may not)" in (refused.details() or "")

    assert t.stubs["vicky"].GetModel(api_pb2.GetModelRequest(name=model)) == before
    version = _version(t, "vicky", model, 1)
    assert (list(version.labels), dict(version.metadata)) == ([], {})


def test_in_default_only_the_owner_and_admins_change_a_model(tenants: Tenants) -> None:
    """Every user is a member of Default: its models are changed by their owners and
    the admins only, whatever the users' role there."""
    t = tenants
    model = _model(t, "vicky")  # in Default
    assert t.stubs["vicky"].GetModel(api_pb2.GetModelRequest(name=model)).workspace == "Default"
    own = _checkpoint(t, _ended(t, "mallory", "mallorys"))
    refused = _refused(lambda: _register(t, "mallory", model, own))
    assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "only they and administrators may add versions to it" in (refused.details() or "")
    archive = api_pb2.ArchiveModelRequest(name=model)
    assert _refused(lambda: t.stubs["eddie"].ArchiveModel(archive)).code() == (
        grpc.StatusCode.PERMISSION_DENIED
    )
    assert t.stubs["admin"].ArchiveModel(archive).archived
    assert not t.stubs["vicky"].UnarchiveModel(api_pb2.UnarchiveModelRequest(name=model)).archived


def test_the_owner_an_editor_of_its_workspace_and_an_admin_may(tenants: Tenants) -> None:
    t = tenants
    model = _model(t, "vicky", "victims")
    experiment = _ended(t, "vicky", "victims")
    assert _register(t, "vicky", model, _checkpoint(t, experiment)) == 1
    # eddie, an editor of "victims", publishes a checkpoint of its experiments.
    assert _register(t, "eddie", model, _checkpoint(t, experiment)) == 2
    assert _register(t, "admin", model, _checkpoint(t, experiment)) == 3
    for user, label in (("vicky", "a"), ("eddie", "b"), ("admin", "c")):
        patch = api_pb2.PatchModelVersionRequest(
            name=model, version=2, labels=api_pb2.LabelList(labels=[label])
        )
        patch.metadata.update({"by": user})
        changed = t.stubs[user].PatchModelVersion(patch)
        assert (list(changed.labels), dict(changed.metadata)) == ([label], {"by": user})
        described = t.stubs[user].PatchModel(
            api_pb2.PatchModelRequest(name=model, description=user)
        )
        assert described.description == user
    t.stubs["eddie"].DeleteModelVersion(api_pb2.DeleteModelVersionRequest(name=model, version=3))
    versions = t.stubs["mallory"].ListModelVersions(api_pb2.ListModelVersionsRequest(name=model))
    assert [(v.version, v.user) for v in versions.versions] == [(1, "vicky"), (2, "eddie")]
    # eddie may not create a model in mallory's workspace, where he is no member.
    create = api_pb2.CreateModelRequest(name="eddies", workspace="mallorys")
    assert _refused(lambda: t.stubs["eddie"].CreateModel(create)).code() == (
        grpc.StatusCode.NOT_FOUND
    )
    # nor mallory in vicky's, where she only reads.
    create = api_pb2.CreateModelRequest(name="mallorys-in-victims", workspace="victims")
    refused = _refused(lambda: t.stubs["mallory"].CreateModel(create))
    assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "cannot create a model in workspace 'victims'" in (refused.details() or "")
    # nor anyone in an archived workspace.
    archive = api_pb2.ArchiveWorkspaceRequest(name="victims", archived=True)
    t.stubs["vicky"].ArchiveWorkspace(archive)
    try:
        create = api_pb2.CreateModelRequest(name="in-archived", workspace="victims")
        refused = _refused(lambda: t.stubs["vicky"].CreateModel(create))
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "workspace 'victims' is archived" in (refused.details() or "")
    finally:
        archive.archived = False
        t.stubs["vicky"].ArchiveWorkspace(archive)


def test_a_reader_cannot_register_anothers_checkpoint(tenants: Tenants) -> None:
    t = tenants
    theirs = _checkpoint(t, _ended(t, "vicky", "victims"))
    model = _model(t, "mallory", "mallorys")

    refused = _refused(lambda: _register(t, "mallory", model, theirs))
    assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
    assert refused.details() == (
        f"cannot register checkpoint {theirs}: a version keeps it from deletion, so only "
        "its experiment's owner and editors of its workspace may register it. mallory is "
        "a viewer of workspace 'victims': creating, steering and deleting experiments in "
        "it needs the editor role (ask an admin of the workspace: `assay workspace "
        "add-member`)"
    )
    stranger = _model(t, "otto")
    refused = _refused(lambda: _register(t, "otto", stranger, theirs))
    assert refused.code() == grpc.StatusCode.NOT_FOUND
    assert refused.details() == f"checkpoint {theirs} does not exist"
    assert t.site.master.store.checkpoint_references([theirs]) == {}


def test_the_owner_deletes_a_checkpoint_pinned_from_another_workspace(tenants: Tenants) -> None:
    """What a reader's registration left behind (or an admin's, from another workspace)
    never stops vicky: the version stays, marked as having lost its checkpoint."""
    t = tenants
    store = t.site.master.store
    experiment = _ended(t, "vicky", "victims")
    pinned, kept_for_experiment = _checkpoint(t, experiment), _checkpoint(t, experiment)
    model = _model(t, "mallory", "mallorys")
    for uuid in (pinned, kept_for_experiment):  # as the registry allowed a reader before
        store.register_version(model, uuid, user_id=store.user_id("mallory"))
    location = store.get_checkpoint(pinned).location

    deleted = t.stubs["vicky"].DeleteCheckpoints(api_pb2.DeleteCheckpointsRequest(uuids=[pinned]))
    assert (list(deleted.deleted), dict(deleted.failed)) == ([pinned], {})
    assert not Path(location).exists()
    gone = _version(t, "mallory", model, 1)
    assert (gone.checkpoint_uuid, gone.checkpoint_deleted) == (pinned, True)
    assert gone.HasField("checkpoint_deleted_at")
    assert not gone.HasField("checkpoint")
    assert gone.code_owner == ""

    # Her experiment too, with the other one.
    t.stubs["vicky"].DeleteExperiment(api_pb2.DeleteExperimentRequest(id=experiment))
    listed = t.stubs["mallory"].ListModelVersions(api_pb2.ListModelVersionsRequest(name=model))
    assert [(v.version, v.checkpoint_deleted) for v in listed.versions] == [(1, True), (2, True)]

    # Loading or downloading it says what happened.
    api = Client(t.address)
    api.use_token(t.tokens["mallory"])
    try:
        version = Session(api).get_model(model).get_version(1)
        assert version.checkpoint_deleted
        with pytest.raises(AssayError) as caught:
            version.load()
        assert str(caught.value) == (
            f"checkpoint {pinned} of {model} version 1 was deleted by its owner: there is "
            "nothing to load or download (register another checkpoint as a new version)"
        )
    finally:
        api.close()


def test_a_version_of_the_checkpoints_own_workspace_still_pins_it(tenants: Tenants) -> None:
    t = tenants
    experiment = _ended(t, "vicky", "victims")
    uuid = _checkpoint(t, experiment)
    model = _model(t, "eddie", "victims")
    _register(t, "eddie", model, uuid)

    for call in (
        lambda: t.stubs["vicky"].DeleteCheckpoints(api_pb2.DeleteCheckpointsRequest(uuids=[uuid])),
        lambda: t.stubs["vicky"].DeleteExperiment(api_pb2.DeleteExperimentRequest(id=experiment)),
    ):
        refused = _refused(call)
        assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"model {model!r} version 1" in (refused.details() or "")
    assert t.site.master.store.get_checkpoint(uuid).state == "COMPLETED"
    # vicky, an admin of its workspace, may delete the version that keeps it.
    t.stubs["vicky"].DeleteModelVersion(api_pb2.DeleteModelVersionRequest(name=model, version=1))
    t.stubs["vicky"].DeleteExperiment(api_pb2.DeleteExperimentRequest(id=experiment))


def _payload(marker: Path) -> dict[str, str]:
    """A model definition whose import leaves `marker`: proof that its code ran."""
    module = f"payload_{uuidlib.uuid4().hex[:8]}"
    code = (
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n\nclass T:\n    pass\n"
    )
    return {f"{module}.py": code}


def test_loading_another_users_code_needs_trust(tenants: Tenants, tmp_path: Path) -> None:
    """A version whose checkpoint's experiment mallory uploaded: loading its Trial runs
    her code in vicky's process only when vicky says she trusts it."""
    t = tenants
    hers, mine = tmp_path / "mallory-ran", tmp_path / "vicky-ran"
    model = _model(t, "vicky", "team")
    _register(t, "mallory", model, _checkpoint(t, _ended(t, "mallory", "team", _payload(hers))))
    _register(t, "vicky", model, _checkpoint(t, _ended(t, "vicky", "team", _payload(mine))))
    api = Client(t.address)
    api.use_token(t.tokens["vicky"])
    try:
        found = Session(api).get_model(model)
        theirs, own = found.get_version(1), found.get_version(2)
        assert (theirs.user, theirs.code_owner, own.code_owner) == ("mallory", "mallory", "vicky")

        with pytest.raises(UntrustedCodeError) as caught:
            theirs.load()
        message = str(caught.value)
        assert f"loading it imports mallory's model code ({_entrypoint(t, theirs)})" in message
        assert "runs it in this process as vicky" in message
        assert "If you trust mallory's code, pass trust=True (load(trust=True))" in message
        assert not hers.exists()

        with pytest.raises(AssayError) as later:  # past the code: the weights are not real
            theirs.load(trust=True)
        assert not isinstance(later.value, UntrustedCodeError)
        assert hers.read_text() == "ran"

        with pytest.raises(AssayError) as own_load:  # one's own code needs no trust
            own.load()
        assert not isinstance(own_load.value, UntrustedCodeError)
        assert mine.read_text() == "ran"
    finally:
        api.close()


def _entrypoint(t: Tenants, version: Any) -> str:
    experiment = t.site.master.store.get_experiment(version.checkpoint.experiment_id)
    return str(experiment.config["entrypoint"])
