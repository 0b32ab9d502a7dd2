"""API handlers for workspaces, projects and config templates."""

from __future__ import annotations

from typing import Any

import grpc

from assay.master.api._servicers._base import ServicerBase
from assay.master.api._status import maps_errors
from assay.master.auth import ADMIN, EDITOR, Principal
from assay.master.errors import (
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
)
from assay.master.store import ProjectRecord, TemplateRecord, WorkspaceRecord
from assay.proto import api_pb2, common_pb2


class WorkspaceRpcs(ServicerBase):
    """Workspaces, their members and projects, and templates (who may do what: `_roles`)."""

    def _workspace_message(self, who: Principal, found: WorkspaceRecord) -> api_pb2.Workspace:
        return api_pb2.Workspace(
            name=found.name,
            archived=found.archived,
            num_projects=found.num_projects,
            num_experiments=found.num_experiments,
            role=self.roles.role(who, found.id) or "",
        )

    def _members(self, workspace_id: int) -> api_pb2.ListWorkspaceMembersResponse:
        return api_pb2.ListWorkspaceMembersResponse(
            members=[
                api_pb2.WorkspaceMember(username=m.username, role=m.role)
                for m in self.store.list_members(workspace_id)
            ]
        )

    @maps_errors
    def CreateWorkspace(  # noqa: N802
        self, request: api_pb2.CreateWorkspaceRequest, context: grpc.ServicerContext
    ) -> api_pb2.Workspace:
        who = self._who(context)
        created = self.store.create_workspace(request.name, who.user_id)
        return self._workspace_message(who, created)

    @maps_errors
    def ListWorkspaces(  # noqa: N802
        self, request: api_pb2.ListWorkspacesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListWorkspacesResponse:
        who = self._who(context)
        found = self.store.list_workspaces(self.roles.visible(who))
        return api_pb2.ListWorkspacesResponse(
            workspaces=[self._workspace_message(who, w) for w in found]
        )

    @maps_errors
    def GetWorkspace(  # noqa: N802
        self, request: api_pb2.GetWorkspaceRequest, context: grpc.ServicerContext
    ) -> api_pb2.GetWorkspaceResponse:
        who = self._who(context)
        found = self.roles.workspace(who, request.name)
        return api_pb2.GetWorkspaceResponse(
            workspace=self._workspace_message(who, found),
            projects=[_project_message(p) for p in self.store.list_projects(found.id)],
            members=self._members(found.id).members,
        )

    @maps_errors
    def ArchiveWorkspace(  # noqa: N802
        self, request: api_pb2.ArchiveWorkspaceRequest, context: grpc.ServicerContext
    ) -> api_pb2.Workspace:
        who = self._who(context)
        found = self.roles.workspace(who, request.name, ADMIN)
        self.store.set_workspace_archived(found.id, request.archived)
        return self._workspace_message(who, self.store.get_workspace(found.name))

    @maps_errors
    def DeleteWorkspace(  # noqa: N802
        self, request: api_pb2.DeleteWorkspaceRequest, context: grpc.ServicerContext
    ) -> api_pb2.DeleteWorkspaceResponse:
        found = self.roles.workspace(self._who(context), request.name, ADMIN)
        pools = self.master.pool_access.named_by_settings(found.id)
        if pools:  # deleted, its name could be claimed by anyone, and the pools with it
            raise ConflictError(
                f"workspace {found.name!r} is bound to resource pool(s) {', '.join(pools)} "
                "by the master's settings (resource_pools[].workspaces): take it out of "
                "them and restart the master before deleting it"
            )
        self.store.delete_workspace(found.id)
        return api_pb2.DeleteWorkspaceResponse()

    @maps_errors
    def ListWorkspaceMembers(  # noqa: N802
        self, request: api_pb2.ListWorkspaceMembersRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListWorkspaceMembersResponse:
        found = self.roles.workspace(self._who(context), request.workspace)
        return self._members(found.id)

    @maps_errors
    def SetWorkspaceMember(  # noqa: N802
        self, request: api_pb2.SetWorkspaceMemberRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListWorkspaceMembersResponse:
        found = self.roles.workspace(self._who(context), request.workspace, ADMIN)
        user = self.store.get_user(request.username)
        self.store.set_member(found.id, user.id, request.role)
        return self._members(found.id)

    @maps_errors
    def RemoveWorkspaceMember(  # noqa: N802
        self, request: api_pb2.RemoveWorkspaceMemberRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListWorkspaceMembersResponse:
        found = self.roles.workspace(self._who(context), request.workspace, ADMIN)
        user = self.store.get_user(request.username)
        if not self.store.remove_member(found.id, user.id):
            raise NotFoundError(f"{user.username} is not a member of workspace {found.name!r}")
        return self._members(found.id)

    @maps_errors
    def CreateProject(  # noqa: N802
        self, request: api_pb2.CreateProjectRequest, context: grpc.ServicerContext
    ) -> api_pb2.Project:
        found = self.roles.workspace(self._who(context), request.workspace, EDITOR)
        if found.archived:
            raise InvalidArgumentError(
                f"workspace {found.name!r} is archived: unarchive it to add projects"
            )
        created = self.store.create_project(found.id, request.name, request.description)
        return _project_message(created)

    @maps_errors
    def ListProjects(  # noqa: N802
        self, request: api_pb2.ListProjectsRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListProjectsResponse:
        who = self._who(context)
        if request.workspace:
            found = self.roles.workspace(who, request.workspace)
            projects = self.store.list_projects(found.id)
        else:
            projects = self.store.list_projects(visible=self.roles.visible(who))
        return api_pb2.ListProjectsResponse(projects=[_project_message(p) for p in projects])

    @maps_errors
    def GetProject(  # noqa: N802
        self, request: api_pb2.GetProjectRequest, context: grpc.ServicerContext
    ) -> api_pb2.Project:
        found = self.roles.project(self._who(context), request.workspace, request.name)
        return _project_message(found)

    @maps_errors
    def ArchiveProject(  # noqa: N802
        self, request: api_pb2.ArchiveProjectRequest, context: grpc.ServicerContext
    ) -> api_pb2.Project:
        found = self.roles.project(self._who(context), request.workspace, request.name, ADMIN)
        self.store.set_project_archived(found.id, request.archived)
        return _project_message(self.store.get_project(found.id))

    @maps_errors
    def DeleteProject(  # noqa: N802
        self, request: api_pb2.DeleteProjectRequest, context: grpc.ServicerContext
    ) -> api_pb2.DeleteProjectResponse:
        found = self.roles.project(self._who(context), request.workspace, request.name, ADMIN)
        self.store.delete_project(found.id)
        return api_pb2.DeleteProjectResponse()

    @maps_errors
    def MoveExperiment(  # noqa: N802
        self, request: api_pb2.MoveExperimentRequest, context: grpc.ServicerContext
    ) -> common_pb2.Experiment:
        who = self._who(context)
        self._may_change(who, request.id)
        target = self.roles.project_ref(who, request.project, EDITOR)
        if target.archived:
            raise InvalidArgumentError(
                f"project {target.workspace}/{target.name} is archived: unarchive it first"
            )
        access = self.master.pool_access
        live = self.master.experiments.get(request.id)
        if live is not None:  # an ended one is checked if it is continued
            access.check(live.config.raw, target.workspace_id, self.store.directory.get())
        self.store.move_experiment(request.id, target.id)
        if live is not None:
            access.hold_back(self.master, [request.id])  # it may use its pool now
        return self._experiment(request.id)

    @maps_errors
    def CreateTemplate(  # noqa: N802
        self, request: api_pb2.CreateTemplateRequest, context: grpc.ServicerContext
    ) -> api_pb2.Template:
        who = self._who(context)
        self.store.create_template(
            request.name, _template_config(request.config_yaml), owner_id=who.user_id
        )
        return _template_message(self.store.get_template(request.name))

    @maps_errors
    def GetTemplate(  # noqa: N802
        self, request: api_pb2.GetTemplateRequest, context: grpc.ServicerContext
    ) -> api_pb2.Template:
        return _template_message(self.store.get_template(request.name))

    @maps_errors
    def ListTemplates(  # noqa: N802
        self, request: api_pb2.ListTemplatesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListTemplatesResponse:
        return api_pb2.ListTemplatesResponse(
            templates=[_template_message(t) for t in self.store.list_templates()]
        )

    @maps_errors
    def DeleteTemplate(  # noqa: N802
        self, request: api_pb2.DeleteTemplateRequest, context: grpc.ServicerContext
    ) -> api_pb2.DeleteTemplateResponse:
        who = self._who(context)
        found = self.store.get_template(request.name)
        if not who.admin and found.owner != who.username:
            raise PermissionDeniedError(
                f"template {request.name!r} is {found.owner}'s: only they or an administrator "
                "may delete it"
            )
        self.store.delete_template(request.name)
        return api_pb2.DeleteTemplateResponse()


def _project_message(found: ProjectRecord) -> api_pb2.Project:
    return api_pb2.Project(
        workspace=found.workspace,
        name=found.name,
        description=found.description,
        archived=found.archived,
        num_experiments=found.num_experiments,
    )


def _template_config(text: str) -> dict[str, Any]:
    """A template's YAML as a mapping, refused if it holds a secret: every user reads
    templates."""
    import yaml

    from assay.config import value_problems
    from assay.master.auth import is_secret_name

    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise InvalidArgumentError(f"the template is not valid YAML: {e}") from None
    if not isinstance(config, dict) or not config:
        raise InvalidArgumentError("a template must be a non-empty mapping of config keys")
    problems, too_deep = value_problems(config)
    if problems or too_deep:
        raise InvalidArgumentError("; ".join(problems) or "the template nests too deep")
    pending: list[Any] = [config]
    while pending:
        value = pending.pop()
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(key, str) and is_secret_name(key) and item not in (None, ""):
                raise InvalidArgumentError(
                    f"the template sets {key}: every user can read templates, so keep secrets "
                    "in the experiment's own config"
                )
            if isinstance(item, dict | list):
                pending.append(item)
    return config


def _template_message(found: TemplateRecord) -> api_pb2.Template:
    import yaml

    message = api_pb2.Template(
        name=found.name,
        config_yaml=yaml.safe_dump(found.config, sort_keys=False),
        owner=found.owner,
    )
    message.created_at.FromDatetime(found.created_at)
    return message
