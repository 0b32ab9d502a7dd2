"""`assay workspace ...` and `assay project ...`: where experiments are filed, and who
may do what with them (roles per workspace), plus `assay experiment move`."""

from __future__ import annotations

from typing import Any

import click

from . import _format as fmt
from ._common import AliasedGroup, client, echo_json, user_errors
from ._experiment import experiment

ROLES = ("viewer", "editor", "admin")


def _workspace_dict(w: Any) -> dict[str, Any]:
    return {
        "name": w.name,
        "archived": w.archived,
        "role": w.role,
        "num_projects": w.num_projects,
        "num_experiments": w.num_experiments,
    }


def _project_dict(p: Any) -> dict[str, Any]:
    return {
        "workspace": p.workspace,
        "name": p.name,
        "description": p.description,
        "archived": p.archived,
        "num_experiments": p.num_experiments,
    }


def _members(response: Any, as_json: bool) -> None:
    members = [{"username": m.username, "role": m.role} for m in response.members]
    if as_json:
        echo_json(members)
        return
    click.echo(fmt.table(["USER", "ROLE"], [[m["username"], m["role"]] for m in members]))


def _projects_table(projects: list[dict[str, Any]]) -> str:
    rows = [
        [
            p["workspace"],
            p["name"] + (" (archived)" if p["archived"] else ""),
            p["num_experiments"],
            p["description"] or None,
        ]
        for p in projects
    ]
    return fmt.table(["WORKSPACE", "PROJECT", "EXPERIMENTS", "DESCRIPTION"], rows)


# --- workspaces ---------------------------------------------------------------------------


@click.group("workspace", cls=AliasedGroup)
def workspace() -> None:
    """Workspaces: a team's projects and experiments, and each member's role.

    Roles: a viewer reads; an editor also creates projects and experiments and steers any
    experiment of the workspace; an admin also manages members, archives and deletes.
    """


@workspace.command("create")
@click.argument("name")
@user_errors
def workspace_create(name: str) -> None:
    """Create workspace NAME; you are its first admin."""
    created = client().workspace_call("CreateWorkspace", name=name)
    click.echo(f"Created workspace {created.name} (you are its admin)")


@workspace.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@user_errors
def workspace_list(as_json: bool) -> None:
    """The workspaces you are a member of (an admin: every one), with your role."""
    found = [_workspace_dict(w) for w in client().workspace_call("ListWorkspaces").workspaces]
    if as_json:
        echo_json(found)
        return
    rows = [
        [
            w["name"] + (" (archived)" if w["archived"] else ""),
            w["role"],
            w["num_projects"],
            w["num_experiments"],
        ]
        for w in found
    ]
    click.echo(fmt.table(["WORKSPACE", "YOUR ROLE", "PROJECTS", "EXPERIMENTS"], rows))


@workspace.command("describe")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@user_errors
def workspace_describe(name: str, as_json: bool) -> None:
    """A workspace, its projects and its members."""
    response = client().workspace_call("GetWorkspace", name=name)
    found = {
        **_workspace_dict(response.workspace),
        "projects": [_project_dict(p) for p in response.projects],
        "members": [{"username": m.username, "role": m.role} for m in response.members],
    }
    if as_json:
        echo_json(found)
        return
    click.echo(f"{'Workspace:':17}{found['name']}" + (" (archived)" if found["archived"] else ""))
    click.echo(f"{'Your role:':17}{found['role']}")
    click.echo(f"{'Experiments:':17}{found['num_experiments']}")
    click.echo("")
    click.echo(_projects_table(found["projects"]))
    click.echo("")
    rows = [[m["username"], m["role"]] for m in found["members"]]
    click.echo(fmt.table(["MEMBER", "ROLE"], rows))


@workspace.command("archive")
@click.argument("name")
@user_errors
def workspace_archive(name: str) -> None:
    """Archive a workspace: no new projects or experiments in it (its admins)."""
    client().workspace_call("ArchiveWorkspace", name=name, archived=True)
    click.echo(f"Archived workspace {name}")


@workspace.command("unarchive")
@click.argument("name")
@user_errors
def workspace_unarchive(name: str) -> None:
    """Unarchive a workspace (its admins)."""
    client().workspace_call("ArchiveWorkspace", name=name, archived=False)
    click.echo(f"Unarchived workspace {name}")


@workspace.command("delete")
@click.argument("name")
@user_errors
def workspace_delete(name: str) -> None:
    """Delete a workspace and its empty projects (its admins). One that holds
    experiments is refused: move them first (`assay experiment move`)."""
    client().workspace_call("DeleteWorkspace", name=name)
    click.echo(f"Deleted workspace {name}")


@workspace.command("members")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@user_errors
def workspace_members(name: str, as_json: bool) -> None:
    """A workspace's members and their roles."""
    _members(client().workspace_call("ListWorkspaceMembers", workspace=name), as_json)


@workspace.command("add-member")
@click.argument("name")
@click.argument("username")
@click.option(
    "--role",
    type=click.Choice(ROLES),
    default="viewer",
    show_default=True,
    help="viewer reads; editor creates and steers experiments; admin also manages members.",
)
@user_errors
def workspace_add_member(name: str, username: str, role: str) -> None:
    """Add USERNAME to workspace NAME with a role, or change their role (its admins)."""
    client().workspace_call("SetWorkspaceMember", workspace=name, username=username, role=role)
    click.echo(f"{username} is {'an' if role[0] in 'ae' else 'a'} {role} of workspace {name}")


@workspace.command("remove-member")
@click.argument("name")
@click.argument("username")
@user_errors
def workspace_remove_member(name: str, username: str) -> None:
    """Remove USERNAME from workspace NAME (its admins)."""
    client().workspace_call("RemoveWorkspaceMember", workspace=name, username=username)
    click.echo(f"{username} is no longer a member of workspace {name}")


# --- projects -----------------------------------------------------------------------------


@click.group("project", cls=AliasedGroup)
def project() -> None:
    """Projects: groups of experiments within a workspace."""


@project.command("create")
@click.argument("workspace_name", metavar="WORKSPACE")
@click.argument("name")
@click.option("--description", default="", help="What the project is for.")
@user_errors
def project_create(workspace_name: str, name: str, description: str) -> None:
    """Create project NAME in WORKSPACE (its editors). Submit to it with `project: NAME`
    and `workspace: WORKSPACE` in the config, or `experiment create --project`."""
    client().workspace_call(
        "CreateProject", workspace=workspace_name, name=name, description=description
    )
    click.echo(f"Created project {workspace_name}/{name}")


@project.command("list")
@click.argument("workspace_name", metavar="[WORKSPACE]", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@user_errors
def project_list(workspace_name: str | None, as_json: bool) -> None:
    """The projects of WORKSPACE, or of every workspace you are a member of."""
    response = client().workspace_call("ListProjects", workspace=workspace_name or "")
    found = [_project_dict(p) for p in response.projects]
    if as_json:
        echo_json(found)
        return
    click.echo(_projects_table(found))


@project.command("describe")
@click.argument("workspace_name", metavar="WORKSPACE")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@user_errors
def project_describe(workspace_name: str, name: str, as_json: bool) -> None:
    """A project and its newest experiments."""
    from assay.proto import api_pb2

    api = client()
    found = _project_dict(api.workspace_call("GetProject", workspace=workspace_name, name=name))
    listed = api.list_experiments(
        api_pb2.ListExperimentsRequest(workspace=workspace_name, project=name, limit=50)
    )
    experiments = [fmt.experiment_summary(e) for e in listed.experiments]
    if as_json:
        echo_json({**found, "experiments": experiments})
        return
    click.echo(f"{'Project:':17}{found['workspace']}/{found['name']}")
    click.echo(f"{'Description:':17}{found['description'] or '-'}")
    click.echo(f"{'Archived:':17}{'yes' if found['archived'] else 'no'}")
    click.echo(f"{'Experiments:':17}{found['num_experiments']}")
    click.echo("")
    rows = [[e["id"], e["name"], e["state"], e["owner"] or None] for e in experiments]
    click.echo(fmt.table(["ID", "NAME", "STATE", "OWNER"], rows))


@project.command("archive")
@click.argument("workspace_name", metavar="WORKSPACE")
@click.argument("name")
@user_errors
def project_archive(workspace_name: str, name: str) -> None:
    """Archive a project: no new experiments in it (the workspace's admins)."""
    client().workspace_call("ArchiveProject", workspace=workspace_name, name=name, archived=True)
    click.echo(f"Archived project {workspace_name}/{name}")


@project.command("unarchive")
@click.argument("workspace_name", metavar="WORKSPACE")
@click.argument("name")
@user_errors
def project_unarchive(workspace_name: str, name: str) -> None:
    """Unarchive a project (the workspace's admins)."""
    client().workspace_call("ArchiveProject", workspace=workspace_name, name=name, archived=False)
    click.echo(f"Unarchived project {workspace_name}/{name}")


@project.command("delete")
@click.argument("workspace_name", metavar="WORKSPACE")
@click.argument("name")
@user_errors
def project_delete(workspace_name: str, name: str) -> None:
    """Delete an empty project (the workspace's admins); one with experiments is refused."""
    client().workspace_call("DeleteProject", workspace=workspace_name, name=name)
    click.echo(f"Deleted project {workspace_name}/{name}")


# --- experiment move ----------------------------------------------------------------------


@experiment.command("move")
@click.argument("experiment_id", metavar="ID", type=int)
@click.argument("project_ref", metavar="PROJECT")
@user_errors
def move_command(experiment_id: int, project_ref: str) -> None:
    """File experiment ID under PROJECT: WORKSPACE/PROJECT, or a project's name when only
    one of your workspaces has it (an editor of both workspaces)."""
    moved = client().workspace_call("MoveExperiment", id=experiment_id, project=project_ref)
    click.echo(f"Moved experiment {moved.id} to {moved.workspace}/{moved.project}")


__all__ = ["project", "workspace"]
