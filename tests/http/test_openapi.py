"""/api/v1/openapi.json: a valid OpenAPI 3.1 document whose schemas match the answers."""

from __future__ import annotations

from typing import Any

import pytest
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate

from assay.master.api import ROUTES
from assay.proto import api_pb2, common_pb2
from tests.http.conftest import World


@pytest.fixture(scope="module")
def document(world: World) -> dict[str, Any]:
    reply = world.site.get("/api/v1/openapi.json")
    assert reply.status == 200
    body: dict[str, Any] = reply.json()
    return body


def test_it_is_valid_openapi_3_1(document: dict[str, Any]) -> None:
    validate(document)
    assert document["openapi"] == "3.1.0"


def test_every_route_is_in_it(document: dict[str, Any]) -> None:
    expected = {
        ("get", "/api/v1/master"),
        ("get", "/api/v1/experiments"),
        ("get", "/api/v1/experiments/{id}"),
        ("get", "/api/v1/experiments/{id}/metrics"),
        ("post", "/api/v1/experiments/{id}/{action}"),
        ("post", "/api/v1/experiments/{id}/continue"),
        ("delete", "/api/v1/experiments/{id}"),
        ("post", "/api/v1/trials/{id}/kill"),
        ("post", "/api/v1/experiments/{id}/set/{name}"),
        ("get", "/api/v1/trials/{id}"),
        ("get", "/api/v1/trials/{id}/metrics"),
        ("get", "/api/v1/trials/{trial_id}/logs"),
        ("get", "/api/v1/checkpoints"),
        ("get", "/api/v1/agents"),
        ("get", "/api/v1/health"),
        ("get", "/api/v1/queue"),
        ("get", "/api/v1/checkpoints/{uuid}"),
        ("post", "/api/v1/experiments"),
        ("post", "/api/v1/checkpoints/delete"),
        ("post", "/api/v1/agents/{id}/enable"),
        ("post", "/api/v1/agents/{id}/disable"),
        ("post", "/api/v1/agents/{id}/remove"),
        ("post", "/api/v1/agents/{id}/drain"),
        ("get", "/api/v1/resource-pools"),
        ("get", "/api/v1/usage"),
        ("post", "/api/v1/login"),
        ("post", "/api/v1/logout"),
        ("get", "/api/v1/me"),
        ("get", "/api/v1/users"),
        ("post", "/api/v1/users"),
        ("post", "/api/v1/users/{username}/password"),
        ("post", "/api/v1/users/{username}/activate"),
        ("post", "/api/v1/users/{username}/deactivate"),
        ("get", "/api/v1/openapi.json"),
        ("get", "/api/v1/models"),
        ("post", "/api/v1/models"),
        ("get", "/api/v1/models/{name}"),
        ("post", "/api/v1/models/{name}/set"),
        ("post", "/api/v1/models/{name}/archive"),
        ("post", "/api/v1/models/{name}/unarchive"),
        ("post", "/api/v1/models/{name}/delete"),
        ("get", "/api/v1/models/{name}/versions"),
        ("post", "/api/v1/models/{name}/versions"),
        ("get", "/api/v1/models/{name}/versions/{version}"),
        ("post", "/api/v1/models/{name}/versions/{version}/set"),
        ("post", "/api/v1/models/{name}/versions/{version}/delete"),
        ("post", "/api/v1/experiments/{id}/move"),
        ("get", "/api/v1/workspaces"),
        ("post", "/api/v1/workspaces"),
        ("get", "/api/v1/workspaces/{name}"),
        ("post", "/api/v1/workspaces/{name}/archive"),
        ("post", "/api/v1/workspaces/{name}/unarchive"),
        ("post", "/api/v1/workspaces/{name}/delete"),
        ("get", "/api/v1/workspaces/{workspace}/members"),
        ("post", "/api/v1/workspaces/{workspace}/members"),
        ("post", "/api/v1/workspaces/{workspace}/members/{username}/remove"),
        ("get", "/api/v1/projects"),
        ("get", "/api/v1/workspaces/{workspace}/projects"),
        ("post", "/api/v1/workspaces/{workspace}/projects"),
        ("get", "/api/v1/workspaces/{workspace}/projects/{name}"),
        ("post", "/api/v1/workspaces/{workspace}/projects/{name}/archive"),
        ("post", "/api/v1/workspaces/{workspace}/projects/{name}/unarchive"),
        ("post", "/api/v1/workspaces/{workspace}/projects/{name}/delete"),
        ("get", "/api/v1/resource-pools/{pool}/workspaces"),
        ("post", "/api/v1/resource-pools/{pool}/bind"),
        ("post", "/api/v1/resource-pools/{pool}/unbind"),
    }
    present = {(m, p) for p, ops in document["paths"].items() for m in ops}
    assert present == expected
    assert {r.url for r in ROUTES} <= set(document["paths"])


def test_parameters_are_the_request_fields(document: dict[str, Any]) -> None:
    listing = document["paths"]["/api/v1/experiments"]["get"]
    names = {p["name"] for p in listing["parameters"]}
    assert names == {f.name for f in api_pb2.ListExperimentsRequest.DESCRIPTOR.fields}
    action = document["paths"]["/api/v1/experiments/{id}/{action}"]["post"]
    [schema] = [p["schema"] for p in action["parameters"] if p["name"] == "action"]
    assert schema["enum"] == ["pause", "activate", "cancel", "kill", "archive", "unarchive"]


def test_schemas_are_generated_from_every_field(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    for message in (common_pb2.Experiment, common_pb2.Trial, common_pb2.Agent):
        descriptor = message.DESCRIPTOR
        assert set(schemas[descriptor.full_name]["properties"]) == {
            f.name for f in descriptor.fields
        }
    experiment = schemas["assay.v1.Experiment"]
    assert "best_validation" not in experiment["required"]  # optional: may be absent
    assert experiment["properties"]["start_time"] == {"type": "string", "format": "date-time"}
    assert schemas["assay.v1.ExperimentState"]["enum"][1] == "EXPERIMENT_STATE_ACTIVE"


def _check(document: dict[str, Any], path: str, method: str, body: Any) -> None:
    operation = document["paths"][path][method]
    schema = operation["responses"]["200"]["content"]["application/json"]["schema"]
    full = {**schema, "components": document["components"]}
    OAS31Validator(full).validate(body)


def test_the_answers_match_their_schemas(world: World, document: dict[str, Any]) -> None:
    site, eid, tid = world.site, world.experiment_id, world.trial_id
    calls = [
        ("/api/v1/master", "/api/v1/master"),
        ("/api/v1/experiments", "/api/v1/experiments"),
        ("/api/v1/experiments/{id}", f"/api/v1/experiments/{eid}"),
        ("/api/v1/experiments/{id}/metrics", f"/api/v1/experiments/{eid}/metrics?name=loss"),
        ("/api/v1/trials/{id}", f"/api/v1/trials/{tid}"),
        ("/api/v1/trials/{id}/metrics", f"/api/v1/trials/{tid}/metrics"),
        ("/api/v1/trials/{trial_id}/logs", f"/api/v1/trials/{tid}/logs"),
        ("/api/v1/checkpoints", f"/api/v1/checkpoints?trial_id={tid}"),
        ("/api/v1/agents", "/api/v1/agents"),
        ("/api/v1/health", "/api/v1/health"),
        ("/api/v1/queue", "/api/v1/queue"),
        ("/api/v1/resource-pools", "/api/v1/resource-pools"),
        ("/api/v1/checkpoints/{uuid}", f"/api/v1/checkpoints/{world.checkpoints[0]}"),
    ]
    for template, url in calls:
        reply = site.get(url)
        assert reply.status == 200, url
        _check(document, template, "get", reply.json())
    error = site.get("/api/v1/trials/999999")
    schema = {"$ref": "#/components/schemas/Error", "components": document["components"]}
    OAS31Validator(schema).validate(error.json())


def test_body_routes_describe_their_body(document: dict[str, Any]) -> None:
    create = document["paths"]["/api/v1/experiments"]["post"]
    assert create["parameters"] == []
    body = create["requestBody"]["content"]["application/json"]["schema"]
    assert set(body["properties"]) == {
        "config_yaml",
        "model_definition",
        "activate",
        "model_definition_from",
    }
    assert body["properties"]["model_definition"]["contentEncoding"] == "base64"
    delete = document["paths"]["/api/v1/checkpoints/delete"]["post"]
    uuids = delete["requestBody"]["content"]["application/json"]["schema"]["properties"]
    assert uuids == {"uuids": {"type": "array", "items": {"type": "string"}}}
    enable = document["paths"]["/api/v1/agents/{id}/enable"]["post"]
    assert enable["operationId"] == "EnableAgent"
    assert [p["name"] for p in enable["parameters"]] == ["id"]  # `enabled` is the route's
    ids = [op["operationId"] for ops in document["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids))
