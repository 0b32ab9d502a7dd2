"""Who may read or change what, by role in a workspace: the one check of gRPC and HTTP.

The HTTP API calls the same servicer methods as gRPC, and each method that names an
experiment, trial, checkpoint, workspace or project asks `Roles` before it acts:

- viewer: reads the workspace, its projects and their experiments (trials, metrics,
  logs, checkpoints);
- editor: also creates projects and experiments in it, steers (pause, activate,
  cancel, kill, archive, set, move, kill a trial) and deletes any experiment of it and
  its checkpoints, their own or others' (an experiment's owner deletes it, and its
  checkpoints, with any role);
- admin: also adds and removes members, changes their roles, archives and deletes.

The Default workspace is shared by every user, so there an editor creates experiments
and steers, changes and deletes only their own (with their trials and checkpoints);
another user's are changed by its owner and by admins alone (`owned`). In workspaces
that someone created, editors keep the rights above.

Cluster admins may do everything everywhere. A user who is not a member of the
workspace gets NOT_FOUND, with the same text as for an id that does not exist, so ids
in other workspaces do not leak; a member whose role is too low gets PERMISSION_DENIED
naming the role that is needed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from assay.master.auth._auth import Principal
from assay.master.errors import InvalidArgumentError, NotFoundError, PermissionDeniedError
from assay.master.store import (
    DEFAULT_WORKSPACE_ID,
    CheckpointRecord,
    ProjectRecord,
    Snapshot,
    Store,
    WorkspaceRecord,
)

VIEWER, EDITOR, ADMIN = "viewer", "editor", "admin"
UNCATEGORIZED = "Uncategorized"
_RANK = {VIEWER: 0, EDITOR: 1, ADMIN: 2}
_WHAT = {
    VIEWER: "reading it",
    EDITOR: "creating, steering and deleting experiments in it",
    ADMIN: "managing its members, archiving and deleting",
}


class Roles:
    """Role checks against the store. Membership, workspaces and projects come from the
    store's directory (store/_directory.py), which every change made through the store
    drops, so a change of role applies to the next call."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def visible(self, who: Principal) -> set[int] | None:
        """The ids of the workspaces `who` sees (None: every one, for a cluster admin)."""
        if who.admin:
            return None
        return set(self.store.roles_of(who.user_id))

    def role(self, who: Principal, workspace_id: int) -> str | None:
        """`who`'s role in the workspace (a cluster admin's is admin), or None."""
        if who.admin:
            return ADMIN
        return self.store.role_in(who.user_id, workspace_id)

    def _need(
        self, who: Principal, workspace_id: int, need: str, missing: str, name: str | None = None
    ) -> str:
        role = self.role(who, workspace_id)
        return _checked(
            who, role, need, missing, name or (lambda: self._workspace_name(workspace_id))
        )

    def experiment(
        self, who: Principal, experiment_id: int, need: str = VIEWER, *, owner_may: bool = False
    ) -> int:
        """Check `who` has `need` in the experiment's workspace; return its project id.

        `owner_may`: the experiment's owner may too, with any role there (deleting its
        experiment or checkpoints stays theirs when their role was lowered to viewer)."""
        missing = f"experiment {experiment_id} does not exist"
        where = self.store.experiment_where(experiment_id)
        if owner_may and need != VIEWER and where.owner_id == who.user_id:
            self._need(who, where.workspace_id, VIEWER, missing)
            return where.project_id
        self.owned(
            who,
            where.workspace_id,
            where.owner_id,
            need,
            missing,
            lambda: (
                f"experiment {experiment_id} belongs to "
                f"{self.store.get_experiment(experiment_id).owner}"
            ),
        )
        return where.project_id

    def owned(
        self,
        who: Principal,
        workspace_id: int,
        owner_id: int,
        need: str,
        missing: str,
        whose: Callable[[], str],
    ) -> str:
        """Check `who` has `need` for a thing that `owner_id` owns in the workspace (an
        experiment, or anything else a user files there); return their role.

        In the Default workspace, which every user shares, editing another user's thing
        needs the admin role: an editor there changes only their own. `whose()` words
        the thing and its owner for the refusal ("experiment 7 belongs to alice")."""
        role = self._need(who, workspace_id, need, missing)
        if (
            workspace_id == DEFAULT_WORKSPACE_ID
            and _RANK[need] >= _RANK[EDITOR]
            and role == EDITOR
            and owner_id != who.user_id
        ):
            raise PermissionDeniedError(
                f"{whose()}: in the shared workspace 'Default' only its owner and admins "
                "may steer, change or delete it (work on experiments together in a "
                "workspace of your own: `assay workspace create`, then `assay workspace "
                "add-member`)"
            )
        return role

    def trial(
        self, who: Principal, trial_id: int, need: str = VIEWER, *, owner_may: bool = False
    ) -> int:
        """Check `who` may read (or `need`) the trial's experiment; return the experiment id."""
        experiment_id = self.store.get_trial(trial_id).experiment_id
        try:
            self.experiment(who, experiment_id, need, owner_may=owner_may)
        except NotFoundError:
            raise NotFoundError(f"trial {trial_id} does not exist") from None
        return experiment_id

    def checkpoint(
        self,
        who: Principal,
        record: CheckpointRecord,
        need: str = VIEWER,
        *,
        owner_may: bool = False,
    ) -> None:
        """Check `who` may read (or `need`) the checkpoint's experiment; to a non-member the
        checkpoint does not exist."""
        try:
            self.trial(who, record.trial_id, need, owner_may=owner_may)
        except NotFoundError:
            raise NotFoundError(f"checkpoint {record.uuid} does not exist") from None

    def workspace(self, who: Principal, name: str, need: str = VIEWER) -> WorkspaceRecord:
        """The workspace named `name`, if `who` has `need` in it."""
        missing = f"workspace {name!r} does not exist"
        if not name:
            raise InvalidArgumentError("give a workspace's name")
        found = self.store.get_workspace(name)
        self._need(who, found.id, need, missing, found.name)
        return found

    def project(
        self, who: Principal, workspace: str, name: str, need: str = VIEWER
    ) -> ProjectRecord:
        """The project `name` of `workspace`, if `who` has `need` in the workspace."""
        found = self.workspace(who, workspace)
        project = self.store.find_project(found.name, name)
        self._need(who, found.id, need, f"workspace {workspace!r} does not exist", found.name)
        return project

    def project_ref(self, who: Principal, ref: str, need: str = VIEWER) -> ProjectRecord:
        """A project named as WORKSPACE/PROJECT, or by its name alone when only one of
        the workspaces `who` sees has a project of that name."""
        if not ref:
            raise InvalidArgumentError("give a project as WORKSPACE/PROJECT or its name")
        workspace, slash, name = ref.rpartition("/")
        if slash:
            return self.project(who, workspace, name, need)
        visible = self.visible(who)
        matches = [p for p in self.store.list_projects(visible=visible) if p.name == name]
        if not matches:
            raise NotFoundError(f"project {name!r} does not exist in a workspace you belong to")
        if len(matches) > 1:
            names = ", ".join(f"{p.workspace}/{p.name}" for p in matches)
            raise InvalidArgumentError(
                f"project {name!r} is in several workspaces ({names}): name it as WORKSPACE/PROJECT"
            )
        return self.project(who, matches[0].workspace, name, need)

    def new_experiment_project(
        self, who: Principal, workspace: str | None, project: str | None
    ) -> ProjectRecord:
        """The project an experiment whose config names `workspace` and `project` goes
        to (Default / Uncategorized for what it leaves out), if `who` is an editor there
        and neither is archived. An unknown name is an error naming the choices."""
        names = (workspace or "Default", project or UNCATEGORIZED)
        snapshot = self.store.directory.get()
        pair = _project_in(snapshot, who, *names)
        if pair is None:  # the store's listings only to explain a miss
            pair = self._explain(*names, _visible_in(snapshot, who))
        return _for_new_experiment(snapshot, who, *pair, names[0])

    def new_experiment_project_now(
        self, who: Principal, workspace: str | None, project: str | None
    ) -> ProjectRecord | None:
        """`new_experiment_project` answered from one snapshot of the store's directory
        (`Directory.cached`), with no I/O, so it may run on an event loop; None when only
        the store can tell (a change or `TTL_S` made the copy stale, or a name is unknown
        and the error lists the choices): then call `new_experiment_project` off the loop."""
        snapshot = self.store.directory.cached()
        if snapshot is None:
            return None
        names = (workspace or "Default", project or UNCATEGORIZED)
        pair = _project_in(snapshot, who, *names)
        return None if pair is None else _for_new_experiment(snapshot, who, *pair, names[0])

    def _explain(
        self, workspace: str, project: str, visible: Collection[int] | None
    ) -> tuple[WorkspaceRecord, ProjectRecord]:
        """What `new_experiment_project` finds when `project_by_names` found nothing: the
        default workspace for Determined's "Uncategorized", else an error naming the
        choices."""
        workspaces = self.store.list_workspaces(visible, counts=False)
        found = next((w for w in workspaces if w.name == workspace), None)
        if found is None and workspace == UNCATEGORIZED:  # Determined's default workspace
            found = next((w for w in workspaces if w.id == DEFAULT_WORKSPACE_ID), None)
        if found is None:
            choices = ", ".join(w.name for w in workspaces) or "none"
            raise InvalidArgumentError(
                f"workspace: there is no workspace {workspace!r} you belong to; yours are "
                f"{choices} (create one with `assay workspace create`)"
            )
        projects = self.store.list_projects(found.id, counts=False)
        chosen = next((p for p in projects if p.name == project), None)
        if chosen is None:
            choices = ", ".join(p.name for p in projects) or "none"
            raise InvalidArgumentError(
                f"project: workspace {workspace!r} has no project {project!r}; its projects "
                f"are {choices} (create one with `assay project create {workspace} NAME`)"
            )
        return found, chosen

    def _workspace_name(self, workspace_id: int) -> str:
        for w in self.store.list_workspaces({workspace_id}):
            return w.name
        return str(workspace_id)


def _checked(
    who: Principal, role: str | None, need: str, missing: str, name: str | Callable[[], str]
) -> str:
    """`role` if it is `need` or above; else NotFoundError (`missing`) for a non-member,
    PermissionDeniedError naming the role needed for a member (`name`: the workspace's,
    or what tells it)."""
    if role is None:
        raise NotFoundError(missing)
    if _RANK[role] < _RANK[need]:
        name = name if isinstance(name, str) else name()
        raise PermissionDeniedError(
            f"{who.username} is {'an' if role[0] in 'ae' else 'a'} {role} of workspace "
            f"{name!r}: {_WHAT[need]} needs the {need} role (ask an admin of the "
            "workspace: `assay workspace add-member`)"
        )
    return role


def _visible_in(snapshot: Snapshot, who: Principal) -> set[int] | None:
    """The ids of the workspaces `who` sees in `snapshot` (None: every one)."""
    return None if who.admin else set(snapshot.roles.get(who.user_id, {}))


def _project_in(
    snapshot: Snapshot, who: Principal, workspace: str, project: str
) -> tuple[WorkspaceRecord, ProjectRecord] | None:
    """Workspace `workspace` among those `who` sees in `snapshot`, and its project."""
    return snapshot.project_by_names(workspace, project, _visible_in(snapshot, who))


def _for_new_experiment(
    snapshot: Snapshot, who: Principal, found: WorkspaceRecord, chosen: ProjectRecord, name: str
) -> ProjectRecord:
    """`chosen` of `found` if `who` is an editor there (their role as `snapshot` has it)
    and neither is archived."""
    role = ADMIN if who.admin else snapshot.roles.get(who.user_id, {}).get(found.id)
    _checked(who, role, EDITOR, f"workspace {name!r} does not exist", name)
    if found.archived or chosen.archived:
        kind = "workspace" if found.archived else "project"
        raise InvalidArgumentError(
            f"{kind} {found.name if found.archived else chosen.name!r} is archived: "
            "unarchive it, or submit to another project"
        )
    return chosen


__all__ = ["ADMIN", "EDITOR", "VIEWER", "Roles"]
