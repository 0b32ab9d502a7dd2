"""The registry's RPCs over HTTP on a real master (the same servicer gRPC calls): who may
do what, what a version shows of its checkpoint, and every refusal's status and words."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from assay.proto import api_pb2
from tests.credentials import login
from tests.http.conftest import Reply, World, world

__all__ = ["world"]


@pytest.fixture(scope="module")
def carol(world: World) -> str:
    """A second, non-admin user's session token."""
    world.site.api.CreateUser(api_pb2.CreateUserRequest(username="carol", password="pw-carol-1234"))
    return login(f"127.0.0.1:{world.site.master.port}", "carol", "pw-carol-1234")


def _post(world: World, path: str, body: Any = None, token: str | None = None) -> Reply:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else b""
    return world.site.post("/api/v1" + path, data, headers=headers)


def _get(world: World, path: str, token: str | None = None) -> Reply:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else None
    return world.site.get("/api/v1" + path, headers=headers)


@pytest.fixture
def model(world: World) -> Iterator[str]:
    name = "iris"
    reply = _post(world, "/models", {"name": name, "labels": ["tabular"], "metadata": {"k": 1}})
    assert reply.status == 200, reply.json()
    yield name
    _post(world, f"/models/{name}/delete?force=true")


def test_a_version_shows_its_checkpoint(world: World, model: str) -> None:
    uuid = world.checkpoints[-1]
    reply = _post(world, f"/models/{model}/versions", {"checkpoint_uuid": uuid, "notes": "first"})
    assert reply.status == 200, reply.json()
    version = reply.json()
    assert (version["model"], version["version"], version["notes"]) == (model, 1, "first")
    assert version["checkpoint"]["experiment_id"] == world.experiment_id
    assert version["checkpoint"]["trial_id"] == world.trial_id
    assert _get(world, f"/models/{model}/versions/0").json()["checkpoint_uuid"] == uuid
    listed = _get(world, "/models?label=tabular").json()["models"]
    assert [(m["name"], m["num_versions"], m["latest_version"]) for m in listed] == [(model, 1, 1)]


def test_any_user_reads_and_only_the_owner_changes_a_default_model(
    world: World, model: str, carol: str
) -> None:
    assert _get(world, f"/models/{model}", carol).status == 200
    uuid = world.checkpoints[-1]
    assert _post(world, f"/models/{model}/versions", {"checkpoint_uuid": uuid}).status == 200
    # Admin's checkpoint of Default is not carol's to keep from deletion.
    refused = _post(world, f"/models/{model}/versions", {"checkpoint_uuid": uuid}, carol)
    assert refused.status == 403
    assert f"cannot register checkpoint {uuid}" in refused.json()["error"]
    for path, body in [
        (f"/models/{model}/set", {"description": "mine now"}),
        (f"/models/{model}/archive", None),
        (f"/models/{model}/delete?force=true", None),
        (f"/models/{model}/versions/1/set", {"notes": "x"}),
        (f"/models/{model}/versions/1/delete", None),
    ]:
        refused = _post(world, path, body, carol)
        assert refused.status == 403, (path, refused.json())
        assert "belongs to admin: only they and administrators" in refused.json()["error"]
    assert _get(world, f"/models/{model}").json()["description"] == ""
    assert _get(world, f"/models/{model}").json()["num_versions"] == 1

    # Carol's own model is hers to change; an admin may change anyone's.
    made = _post(world, "/models", {"name": "carols"}, carol)
    assert (made.status, made.json()["workspace"]) == (200, "Default")
    assert _post(world, "/models/carols/set", {"description": "c"}, carol).status == 200
    assert _post(world, "/models/carols/archive").status == 200
    assert _post(world, "/models/carols/delete", None, carol).status == 200


def test_patch_replaces_labels_and_merges_metadata(world: World, model: str) -> None:
    body = {"labels": {"labels": ["a", "b"]}, "metadata": {"k": None, "new": "v"}}
    changed = _post(world, f"/models/{model}/set", body).json()
    assert (changed["labels"], changed["metadata"]) == (["a", "b"], {"new": "v"})
    unchanged = _post(world, f"/models/{model}/set", {"description": "d"}).json()
    assert (unchanged["labels"], unchanged["description"]) == (["a", "b"], "d")


@pytest.mark.parametrize(
    ("path", "body", "status", "says"),
    [
        ("/models", {"name": "iris"}, 409, "a model named 'iris' exists already"),
        ("/models", {"name": "no/slash"}, 400, "model name 'no/slash' is not allowed"),
        ("/models", {"name": ""}, 400, "model name '' is not allowed"),
        ("/models/nope/versions", {"checkpoint_uuid": "x"}, 404, "model 'nope' does not exist"),
        ("/models/iris/versions", {"checkpoint_uuid": "not-a-uuid"}, 400, "not-a-uuid"),
        (
            "/models/iris/versions",
            {"checkpoint_uuid": "00000000-0000-4000-8000-000000000000"},
            404,
            "checkpoint 00000000-0000-4000-8000-000000000000 does not exist",
        ),
        ("/models/iris/versions/9/delete", None, 404, "model 'iris' has no version 9"),
        ("/models/iris/set", {"labels": {"labels": [""]}}, 400, "label '' is not allowed"),
    ],
)
def test_bad_requests_are_refused_with_what_to_fix(
    world: World, model: str, path: str, body: Any, status: int, says: str
) -> None:
    reply = _post(world, path, body)
    assert reply.status == status, reply.json()
    assert says in reply.json()["error"]
    assert _get(world, f"/models/{model}").json()["labels"] == ["tabular"]


def test_a_registered_checkpoint_cannot_be_deleted(world: World, model: str) -> None:
    uuid = world.checkpoints[0]
    assert _post(world, f"/models/{model}/versions", {"checkpoint_uuid": uuid}).status == 200

    refused = _post(world, "/checkpoints/delete", {"uuids": [uuid]})
    assert refused.status == 409
    assert f"checkpoint {uuid} is registered as model 'iris' version 1" in refused.json()["error"]

    refused = _post(world, f"/models/{model}/delete")
    assert refused.status == 409
    assert "has 1 version" in refused.json()["error"]
    deleted = _post(world, f"/models/{model}/delete?force=true")
    assert deleted.json() == {"versions_deleted": 1}
    assert _get(world, f"/models/{model}").status == 404
