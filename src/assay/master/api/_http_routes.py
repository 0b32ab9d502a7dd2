"""The HTTP API's routes: which URL calls which RPC of the `Api` service.

This table is all that is written per route. The request, the response and whether it
streams come from the RPC's descriptor in proto/api.proto; path segments in braces are
named after the request's fields, and the query string takes the rest of its fields.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, MethodDescriptor
from google.protobuf.message import Message

from assay.common.archive import MAX_MODEL_DEF_BYTES
from assay.proto import api_pb2

PREFIX = "/api/v1"
_SERVICE = api_pb2.DESCRIPTOR.services_by_name["Api"]


@dataclass(frozen=True)
class Route:
    method: str  # GET | POST | DELETE
    path: str  # under PREFIX, e.g. "/experiments/{id}"
    rpc: str  # a method of the Api service
    summary: str
    # Of these request fields, a call must give exactly one.
    one_of: tuple[str, ...] = field(default=())
    # The request's fields outside the path come from a JSON object in the body (the
    # message's JSON form), not from the query string.
    body: bool = False
    # Request fields the route itself sets: (name, value) pairs.
    fixed: tuple[tuple[str, object], ...] = field(default=())
    # The largest body the route reads; a longer one is refused before it is read.
    max_body: int = 2**20
    # The OpenAPI operationId when the RPC's name is taken by another route.
    operation: str = ""

    @property
    def operation_id(self) -> str:
        return self.operation or self.rpc

    @property
    def descriptor(self) -> MethodDescriptor:
        return _SERVICE.methods_by_name[self.rpc]

    @property
    def request(self) -> Descriptor:
        return self.descriptor.input_type

    @property
    def response(self) -> Descriptor:
        return self.descriptor.output_type

    @property
    def request_class(self) -> type[Message]:
        return message_factory.GetMessageClass(self.request)

    @property
    def streams(self) -> bool:
        return bool(self.descriptor.server_streaming)

    @property
    def url(self) -> str:
        return PREFIX + self.path

    @property
    def path_fields(self) -> list[str]:
        return re.findall(r"\{(\w+)\}", self.path)

    @property
    def taken(self) -> set[str]:
        """The request fields the URL sets: the path's and the fixed ones."""
        return set(self.path_fields) | {name for name, _ in self.fixed}


# A model definition of MAX_MODEL_DEF_BYTES in base64, with room for the config.
_CREATE_BODY = (MAX_MODEL_DEF_BYTES * 4) // 3 + 2**20


ROUTES: tuple[Route, ...] = (
    Route(
        "POST",
        "/login",
        "Login",
        'Log in with a JSON body {"username", "password"}; the answer\'s token goes in '
        "`Authorization: Bearer <token>` on every other route",
        body=True,
    ),
    Route("POST", "/logout", "Logout", "End the session of the token sent", body=True),
    Route("GET", "/me", "WhoAmI", "The user the token belongs to"),
    Route("GET", "/users", "ListUsers", "The master's users"),
    Route("POST", "/users", "CreateUser", "Create a user (admins only)", body=True),
    Route(
        "POST",
        "/users/{username}/password",
        "ChangePassword",
        "Change a password: your own with `old_password`, anyone's as an admin",
        body=True,
    ),
    Route(
        "POST",
        "/users/{username}/activate",
        "SetUserActive",
        "Let a user log in again (admins only)",
        fixed=(("active", True),),
        operation="ActivateUser",
    ),
    Route(
        "POST",
        "/users/{username}/deactivate",
        "SetUserActive",
        "Stop a user from logging in and end their sessions (admins only)",
        fixed=(("active", False),),
        operation="DeactivateUser",
    ),
    Route("GET", "/master", "GetMasterInfo", "The master's version, store and cluster size"),
    Route("GET", "/experiments", "ListExperiments", "Experiments, filtered, sorted and paged"),
    Route(
        "POST",
        "/experiments",
        "CreateExperiment",
        "Submit an experiment: the config as YAML text and the model directory as a "
        "base64 gzip tar (what `assay experiment create` packs), or with "
        "`model_definition_from` another experiment's (a fork)",
        body=True,
        max_body=_CREATE_BODY,
    ),
    Route(
        "GET",
        "/experiments/{id}",
        "GetExperiment",
        "An experiment, its trials and the names of the metrics they reported",
    ),
    Route(
        "GET",
        "/experiments/{id}/metrics",
        "GetExperimentMetrics",
        "One metric's curve for every trial of an experiment, downsampled",
    ),
    Route(
        "DELETE",
        "/experiments/{id}",
        "DeleteExperiment",
        "Delete an ended experiment: its checkpoints' files, then its trials, metrics, "
        "logs and checkpoint records (refused while it runs or a model version pins one "
        "of its checkpoints)",
    ),
    Route(
        "POST",
        "/experiments/{id}/move",
        "MoveExperiment",
        'File an experiment under another project: a JSON body {"project": '
        '"WORKSPACE/PROJECT"} (an editor of both workspaces)',
        body=True,
    ),
    Route(
        "POST",
        "/experiments/{id}/continue",
        "ContinueExperiment",
        "Continue a finished single-trial experiment's trial from its latest checkpoint: a "
        'JSON body {"config_yaml"}, the keys to change (e.g. searcher.max_length)',
        body=True,
    ),
    Route(
        "POST",
        "/experiments/{id}/{action}",
        "ExperimentAction",
        "Pause, activate, cancel, kill, archive or unarchive an experiment",
    ),
    Route(
        "POST",
        "/experiments/{id}/set/{name}",
        "SetExperimentResource",
        'Change a live experiment\'s priority, weight or max-slots: a JSON body {"value"} '
        "(its owner or an admin); the next scheduling round uses it",
        body=True,
    ),
    Route("GET", "/trials/{id}", "GetTrial", "A trial"),
    Route("GET", "/trials/{id}/metrics", "GetTrialMetrics", "A trial's metrics of one group"),
    Route(
        "POST",
        "/trials/{id}/kill",
        "KillTrial",
        "Kill one trial of a live experiment; the searcher sees it exit and the "
        "experiment goes on with its other trials",
    ),
    Route(
        "GET",
        "/trials/{trial_id}/logs",
        "StreamTrialLogs",
        "A trial's log lines after `after_id` as a JSON array; with follow=true, as "
        "server-sent events (one `data:` event per line) until the trial ends",
    ),
    Route(
        "GET",
        "/checkpoints",
        "ListCheckpoints",
        "The checkpoints of an experiment or of a trial",
        one_of=("experiment_id", "trial_id"),
    ),
    Route("GET", "/checkpoints/{uuid}", "GetCheckpoint", "A checkpoint"),
    Route(
        "POST",
        "/checkpoints/delete",
        "DeleteCheckpoints",
        'Delete checkpoints\' files and mark them deleted; a JSON body {"uuids": [...]}',
        body=True,
    ),
    Route("GET", "/agents", "ListAgents", "Agents, their devices and slots"),
    Route(
        "POST",
        "/agents/{id}/enable",
        "SetAgentEnabled",
        "Let the scheduler place trials on the agent again",
        fixed=(("enabled", True), ("drain", False)),
        operation="EnableAgent",
    ),
    Route(
        "POST",
        "/agents/{id}/disable",
        "SetAgentEnabled",
        "Place no new trials on the agent (running ones go on)",
        fixed=(("enabled", False), ("drain", False)),
        operation="DisableAgent",
    ),
    Route(
        "POST",
        "/agents/{id}/drain",
        "SetAgentEnabled",
        "Place no new trials on the agent and let its running ones finish (draining)",
        fixed=(("enabled", False), ("drain", True)),
        operation="DrainAgent",
    ),
    Route(
        "POST",
        "/agents/{id}/remove",
        "RemoveAgent",
        "Forget an agent's credential so its name can join again; a connected agent is "
        "disconnected and its trials requeued (admins only)",
    ),
    Route("GET", "/queue", "GetQueue", "The trials waiting for slots, first to be placed first"),
    Route(
        "GET",
        "/resource-pools",
        "ListResourcePools",
        "The resource pools, their agents, slots per slot type and queued trials",
    ),
    Route(
        "GET",
        "/resource-pools/{pool}/workspaces",
        "ListResourcePoolWorkspaces",
        "The workspaces a pool is bound to (none: it is open to every workspace)",
    ),
    Route(
        "POST",
        "/resource-pools/{pool}/bind",
        "BindResourcePool",
        'Bind a pool to a workspace, a JSON body {"workspace": NAME}: a bound pool takes '
        "experiments of its bound workspaces only (admins only)",
        body=True,
    ),
    Route(
        "POST",
        "/resource-pools/{pool}/unbind",
        "UnbindResourcePool",
        'Remove a pool\'s binding to a workspace, a JSON body {"workspace": NAME} (admins only)',
        body=True,
    ),
    Route(
        "GET",
        "/usage",
        "GetUsage",
        "Slot-hours used in [since, until) by user, experiment, pool, agent or day; a user "
        "sees only their own usage, an admin everyone's and each pool's idle share",
    ),
    Route(
        "GET",
        "/models",
        "ListModels",
        "Registered models by name, filtered by a part of the name, a label or archived",
    ),
    Route(
        "POST",
        "/models",
        "CreateModel",
        'Create a model: a JSON body {"name", "description", "labels", "metadata", '
        '"workspace"} (default: Default; elsewhere its editors may)',
        body=True,
    ),
    Route("GET", "/models/{name}", "GetModel", "A registered model"),
    Route(
        "POST",
        "/models/{name}/set",
        "PatchModel",
        'Change a model\'s description, labels (replaced: {"labels": {"labels": [...]}}) or '
        "metadata (keys merged, null removes one); its owner, an editor of its workspace "
        "(not of Default) or an admin",
        body=True,
    ),
    Route(
        "POST",
        "/models/{name}/archive",
        "ArchiveModel",
        "Archive a model: listed apart, no new versions (who may change it)",
    ),
    Route(
        "POST",
        "/models/{name}/unarchive",
        "UnarchiveModel",
        "Unarchive a model (who may change it)",
    ),
    Route(
        "POST",
        "/models/{name}/delete",
        "DeleteModel",
        "Delete a model; one with versions only with force=true, which deletes them too "
        "(who may change it)",
    ),
    Route(
        "GET",
        "/models/{name}/versions",
        "ListModelVersions",
        "A model's versions, each with who registered it and its checkpoint (experiment, "
        "trial, metrics, whose code; or that its owner deleted it)",
    ),
    Route(
        "POST",
        "/models/{name}/versions",
        "RegisterModelVersion",
        'Register a checkpoint as the model\'s next version: a JSON body {"checkpoint_uuid", '
        '"notes", "labels", "metadata"}: who may change the model, and may delete the '
        "checkpoint (its experiment's owner or an editor of its workspace)",
        body=True,
    ),
    Route(
        "GET",
        "/models/{name}/versions/{version}",
        "GetModelVersion",
        "One version of a model (0: the latest)",
    ),
    Route(
        "POST",
        "/models/{name}/versions/{version}/set",
        "PatchModelVersion",
        "Change a version's notes, labels or metadata (who may change the model)",
        body=True,
    ),
    Route(
        "POST",
        "/models/{name}/versions/{version}/delete",
        "DeleteModelVersion",
        "Delete a version; its checkpoint is no longer kept for it (who may change the model)",
    ),
    Route(
        "GET",
        "/workspaces",
        "ListWorkspaces",
        "The workspaces the caller is a member of (an admin: all), with the caller's role",
    ),
    Route(
        "POST",
        "/workspaces",
        "CreateWorkspace",
        'Create a workspace: a JSON body {"name"}; its creator is its first admin',
        body=True,
    ),
    Route(
        "GET",
        "/workspaces/{name}",
        "GetWorkspace",
        "A workspace with its projects and members (members only)",
    ),
    Route(
        "POST",
        "/workspaces/{name}/archive",
        "ArchiveWorkspace",
        "Archive a workspace: no new projects or experiments in it (its admins)",
        fixed=(("archived", True),),
    ),
    Route(
        "POST",
        "/workspaces/{name}/unarchive",
        "ArchiveWorkspace",
        "Unarchive a workspace (its admins)",
        fixed=(("archived", False),),
        operation="UnarchiveWorkspace",
    ),
    Route(
        "POST",
        "/workspaces/{name}/delete",
        "DeleteWorkspace",
        "Delete a workspace that holds no experiments, with its empty projects (its admins)",
    ),
    Route(
        "GET",
        "/workspaces/{workspace}/members",
        "ListWorkspaceMembers",
        "A workspace's members and their roles",
    ),
    Route(
        "POST",
        "/workspaces/{workspace}/members",
        "SetWorkspaceMember",
        'Add a member or change their role: a JSON body {"username", "role"} with role '
        "viewer, editor or admin (the workspace's admins)",
        body=True,
    ),
    Route(
        "POST",
        "/workspaces/{workspace}/members/{username}/remove",
        "RemoveWorkspaceMember",
        "Remove a member from a workspace (its admins)",
    ),
    Route(
        "GET",
        "/projects",
        "ListProjects",
        "The projects of every workspace the caller is a member of",
        operation="ListAllProjects",
    ),
    Route("GET", "/workspaces/{workspace}/projects", "ListProjects", "A workspace's projects"),
    Route(
        "POST",
        "/workspaces/{workspace}/projects",
        "CreateProject",
        'Create a project: a JSON body {"name", "description"} (the workspace\'s editors)',
        body=True,
    ),
    Route(
        "GET",
        "/workspaces/{workspace}/projects/{name}",
        "GetProject",
        "A project (list its experiments with GET /experiments?workspace=W&project=P)",
    ),
    Route(
        "POST",
        "/workspaces/{workspace}/projects/{name}/archive",
        "ArchiveProject",
        "Archive a project: no new experiments in it (the workspace's admins)",
        fixed=(("archived", True),),
    ),
    Route(
        "POST",
        "/workspaces/{workspace}/projects/{name}/unarchive",
        "ArchiveProject",
        "Unarchive a project (the workspace's admins)",
        fixed=(("archived", False),),
        operation="UnarchiveProject",
    ),
    Route(
        "POST",
        "/workspaces/{workspace}/projects/{name}/delete",
        "DeleteProject",
        "Delete a project that holds no experiments (the workspace's admins)",
    ),
)
