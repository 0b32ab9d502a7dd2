"""Workspaces, their projects, and each user's role in a workspace.

Every experiment belongs to a project and every project to a workspace. The "Default"
workspace and its "Uncategorized" project (id 1 each, made by migration 0009) hold the
experiments whose config names neither; they cannot be deleted. A user created later
becomes an editor of the Default workspace (as every user was when it was made); a
workspace created later starts with its creator as its only admin.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from assay.master.errors import ConflictError, InvalidArgumentError, NotFoundError
from assay.master.store._base import StoreBase
from assay.master.store._directory import Directory, Snapshot
from assay.master.store._models import (
    DEFAULT_PROJECT_ID,
    DEFAULT_WORKSPACE_ID,
    Experiment,
    PoolBinding,
    Project,
    RegisteredModel,
    Trial,
    User,
    Workspace,
    WorkspaceMember,
)
from assay.master.store._records import ProjectRecord, WorkspaceRecord

ROLES = ("viewer", "editor", "admin")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 _.-]{0,127}")


@dataclass(frozen=True)
class Placement:
    """Where an experiment is filed, and who owns it."""

    workspace_id: int
    project_id: int
    owner_id: int


@dataclass(frozen=True)
class MemberRecord:
    username: str
    role: str


def check_name(kind: str, name: str) -> str:
    """A workspace's or project's name as given, or `InvalidArgumentError`."""
    if not _NAME.fullmatch(name) or name != name.strip() or "/" in name:
        raise InvalidArgumentError(
            f"{kind} name {name!r}: use 1 to 128 letters, digits, spaces, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return name


def check_role(role: str) -> str:
    if role not in ROLES:
        raise InvalidArgumentError(f"role {role!r}: give one of {', '.join(ROLES)}")
    return role


class WorkspaceQueries(StoreBase):
    """Workspaces, projects and membership.

    `project_by_names`, `roles_of` and `role_in` (what every submission and role check
    asks) answer from `directory`, an in-memory copy that each write here drops once it
    has committed (see _directory.py)."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.directory = Directory(self._load_directory)

    def _members_changed(self) -> None:
        self.directory.changed()

    @contextmanager
    def _write_directory(self) -> Iterator[Session]:
        """`write()`, then drop the directory (committed or not: a failed write costs a
        reload, never a stale copy)."""
        try:
            with self.write() as s:
                yield s
        finally:
            self.directory.changed()

    def _load_directory(self) -> Snapshot:
        snapshot = Snapshot()
        with self.read() as s:
            for wid, wname, warchived in s.execute(
                select(Workspace.id, Workspace.name, Workspace.archived)
            ):
                record = WorkspaceRecord(wid, wname, bool(warchived))
                snapshot.workspaces[wid] = snapshot.by_name[wname] = record
            for pid, wid, pname, description, parchived in s.execute(
                select(
                    Project.id,
                    Project.workspace_id,
                    Project.name,
                    Project.description,
                    Project.archived,
                )
            ):
                workspace = snapshot.workspaces.get(wid)
                if workspace is not None:
                    snapshot.projects[(wid, pname)] = ProjectRecord(
                        pid, wid, workspace.name, pname, description, bool(parchived)
                    )
            for uid, wid, role in s.execute(
                select(WorkspaceMember.user_id, WorkspaceMember.workspace_id, WorkspaceMember.role)
            ):
                snapshot.roles.setdefault(uid, {})[wid] = role
            pools: dict[str, set[int]] = {}
            for pool, wid in s.execute(select(PoolBinding.pool, PoolBinding.workspace_id)):
                pools.setdefault(pool, set()).add(wid)
            snapshot.pools.update((pool, frozenset(ids)) for pool, ids in pools.items())
        return snapshot

    # --- workspaces -----------------------------------------------------------------------

    def create_workspace(self, name: str, creator_id: int) -> WorkspaceRecord:
        """A new workspace whose one member, `creator_id`, is its admin."""
        check_name("workspace", name)
        try:
            with self._write_directory() as s:
                workspace = Workspace(name=name, archived=False)
                s.add(workspace)
                s.flush()
                s.add(WorkspaceMember(workspace_id=workspace.id, user_id=creator_id, role="admin"))
                return WorkspaceRecord(workspace.id, workspace.name, False)
        except IntegrityError:
            raise ConflictError(f"workspace {name!r} already exists") from None

    def settings_workspace(self, name: str) -> WorkspaceRecord:
        """The workspace named `name`, made with no members if there is none: a name the
        master's settings bind a pool to is taken at start, so no user can claim it by
        creating a workspace of that name."""
        check_name("workspace", name)
        for _ in range(2):  # a workspace of that name made meanwhile: found the second time
            found = self.directory.get().by_name.get(name)
            if found is not None:
                return found
            try:
                with self._write_directory() as s:
                    workspace = Workspace(name=name, archived=False)
                    s.add(workspace)
                    s.flush()
                    return WorkspaceRecord(workspace.id, workspace.name, False)
            except IntegrityError:
                continue
        return self.get_workspace(name)

    def get_workspace(self, name: str) -> WorkspaceRecord:
        with self.read() as s:
            found = s.execute(select(Workspace).where(Workspace.name == name)).scalar()
            if found is None:
                raise NotFoundError(f"workspace {name!r} does not exist")
            return _workspace(s, found)

    def list_workspaces(
        self, visible: Collection[int] | None = None, *, counts: bool = True
    ) -> list[WorkspaceRecord]:
        """Every workspace (`visible` None), or those whose ids are in `visible`.
        `counts` False: without their project and experiment counts (left 0), which cost
        a count over the workspace's experiments each (not for every submission)."""
        query = select(Workspace).order_by(Workspace.id)
        if visible is not None:
            query = query.where(Workspace.id.in_(list(visible)))
        with self.read() as s:
            found = s.execute(query).scalars()
            if not counts:
                return [WorkspaceRecord(w.id, w.name, w.archived) for w in found]
            return [_workspace(s, w) for w in found]

    def set_workspace_archived(self, workspace_id: int, archived: bool) -> None:
        with self._write_directory() as s:
            s.execute(
                update(Workspace).where(Workspace.id == workspace_id).values(archived=archived)
            )

    def delete_workspace(self, workspace_id: int) -> None:
        """Delete a workspace, its (empty) projects and its membership; one that holds
        experiments or models, one bound to a resource pool, or the Default workspace, is
        refused (nothing deleted)."""
        with self._write_directory() as s:
            workspace = s.get(Workspace, workspace_id)
            if workspace is None:
                raise NotFoundError(f"workspace {workspace_id} does not exist")
            if workspace_id == DEFAULT_WORKSPACE_ID:
                raise ConflictError(
                    f"workspace {workspace.name!r} is the default workspace: it cannot be deleted"
                )
            held = _experiments_in(s, Project.workspace_id == workspace_id)
            if held:
                raise ConflictError(
                    f"workspace {workspace.name!r} holds {held} experiment(s): move them to "
                    "another project (`assay experiment move`) before deleting it"
                )
            models = s.execute(
                select(func.count())
                .select_from(RegisteredModel)
                .where(RegisteredModel.workspace_id == workspace_id)
            ).scalar_one()
            if models:
                raise ConflictError(
                    f"workspace {workspace.name!r} holds {models} model(s) of the registry: "
                    "delete them (`assay model delete --force`) before deleting it"
                )
            pools = sorted(
                s.execute(select(PoolBinding.pool).where(PoolBinding.workspace_id == workspace_id))
                .scalars()
                .all()
            )
            if pools:  # with its last binding gone, a pool would take every workspace's
                raise ConflictError(
                    f"workspace {workspace.name!r} is bound to resource pool(s) "
                    f"{', '.join(pools)}: an administrator unbinds it first (`assay "
                    f"resource-pool unbind {pools[0]} {workspace.name}`)"
                )
            s.execute(delete(WorkspaceMember).where(WorkspaceMember.workspace_id == workspace_id))
            s.execute(delete(Project).where(Project.workspace_id == workspace_id))
            s.delete(workspace)

    # --- membership -----------------------------------------------------------------------

    def set_member(self, workspace_id: int, user_id: int, role: str) -> None:
        """Give the user `role` in the workspace (added, or changed; idempotent)."""
        check_role(role)
        with self._write_directory() as s:
            found = s.get(WorkspaceMember, (workspace_id, user_id))
            if found is None:
                s.add(WorkspaceMember(workspace_id=workspace_id, user_id=user_id, role=role))
            else:
                found.role = role

    def remove_member(self, workspace_id: int, user_id: int) -> bool:
        """Whether the user was a member (and is no longer)."""
        with self._write_directory() as s:
            result = s.execute(
                delete(WorkspaceMember).where(
                    WorkspaceMember.workspace_id == workspace_id,
                    WorkspaceMember.user_id == user_id,
                )
            )
            return bool(getattr(result, "rowcount", 0))

    def list_members(self, workspace_id: int) -> list[MemberRecord]:
        with self.read() as s:
            rows = s.execute(
                select(User.username, WorkspaceMember.role)
                .join(User, User.id == WorkspaceMember.user_id)
                .where(WorkspaceMember.workspace_id == workspace_id)
                .order_by(User.username)
            ).all()
            return [MemberRecord(name, role) for name, role in rows]

    def roles_of(self, user_id: int) -> dict[int, str]:
        """The user's role in each workspace they belong to, by workspace id."""
        return dict(self.directory.get().roles.get(user_id, {}))

    def role_in(self, user_id: int, workspace_id: int) -> str | None:
        return self.directory.get().roles.get(user_id, {}).get(workspace_id)

    # --- resource pools -------------------------------------------------------------------

    def bind_pool(self, pool: str, workspace_id: int) -> bool:
        """Bind the pool to the workspace; False if it was bound already (idempotent)."""
        try:
            with self._write_directory() as s:
                if s.get(PoolBinding, (pool, workspace_id)) is not None:
                    return False
                if s.get(Workspace, workspace_id) is None:
                    raise NotFoundError(f"workspace {workspace_id} does not exist")
                s.add(PoolBinding(pool=pool, workspace_id=workspace_id))
                return True
        except IntegrityError:  # the same binding, made at the same time
            return False

    def unbind_pool(self, pool: str, workspace_id: int) -> bool:
        """Whether the pool was bound to the workspace (and is no longer)."""
        with self._write_directory() as s:
            result = s.execute(
                delete(PoolBinding).where(
                    PoolBinding.pool == pool, PoolBinding.workspace_id == workspace_id
                )
            )
            return bool(getattr(result, "rowcount", 0))

    def pool_bindings(self) -> dict[str, frozenset[int]]:
        """The workspaces (ids) each pool was bound to by `bind_pool`, by pool name."""
        return dict(self.directory.get().pools)

    # --- projects -------------------------------------------------------------------------

    def create_project(self, workspace_id: int, name: str, description: str = "") -> ProjectRecord:
        check_name("project", name)
        try:
            with self._write_directory() as s:
                workspace = s.get(Workspace, workspace_id)
                if workspace is None:
                    raise NotFoundError(f"workspace {workspace_id} does not exist")
                project = Project(
                    workspace_id=workspace_id, name=name, description=description, archived=False
                )
                s.add(project)
                s.flush()
                return ProjectRecord(
                    project.id, workspace_id, workspace.name, name, description, False
                )
        except IntegrityError:
            raise ConflictError(f"project {name!r} already exists in this workspace") from None

    def get_project(self, project_id: int) -> ProjectRecord:
        with self.read() as s:
            row = s.execute(_project_query().where(Project.id == project_id)).first()
            if row is None:
                raise NotFoundError(f"project {project_id} does not exist")
            return _project(s, row[0], row[1])

    def project_by_names(
        self, workspace: str, project: str, visible: Collection[int] | None = None
    ) -> tuple[WorkspaceRecord, ProjectRecord] | None:
        """Workspace `workspace` (among `visible`, if given) and its project `project`,
        without counts, from the directory; None if either is not there."""
        return self.directory.get().project_by_names(workspace, project, visible)

    def find_project(self, workspace: str | None, name: str) -> ProjectRecord:
        """The project `name` of `workspace`; without a workspace, the one project of
        that name in any workspace (ambiguous: `InvalidArgumentError` naming them)."""
        query = _project_query().where(Project.name == name)
        if workspace is not None:
            query = query.where(Workspace.name == workspace)
        with self.read() as s:
            rows = s.execute(query.order_by(Project.id)).all()
            if not rows:
                where = f" in workspace {workspace!r}" if workspace is not None else ""
                raise NotFoundError(f"project {name!r} does not exist{where}")
            if len(rows) > 1:
                names = ", ".join(f"{w}/{name}" for _, w in rows)
                raise InvalidArgumentError(
                    f"project {name!r} is in several workspaces ({names}): "
                    "name it as WORKSPACE/PROJECT"
                )
            return _project(s, rows[0][0], rows[0][1])

    def list_projects(
        self,
        workspace_id: int | None = None,
        visible: Collection[int] | None = None,
        *,
        counts: bool = True,
    ) -> list[ProjectRecord]:
        """`counts` False: without their experiment counts (left 0)."""
        query = _project_query()
        if workspace_id is not None:
            query = query.where(Project.workspace_id == workspace_id)
        if visible is not None:
            query = query.where(Project.workspace_id.in_(list(visible)))
        with self.read() as s:
            rows = s.execute(query.order_by(Workspace.id, Project.name)).all()
            return [_project(s, p, w, counts=counts) for p, w in rows]

    def set_project_archived(self, project_id: int, archived: bool) -> None:
        with self._write_directory() as s:
            s.execute(update(Project).where(Project.id == project_id).values(archived=archived))

    def delete_project(self, project_id: int) -> None:
        """Delete an empty project; one with experiments, or the default, is refused."""
        with self._write_directory() as s:
            project = s.get(Project, project_id)
            if project is None:
                raise NotFoundError(f"project {project_id} does not exist")
            if project_id == DEFAULT_PROJECT_ID:
                raise ConflictError(
                    f"project {project.name!r} is the default project: it cannot be deleted"
                )
            held = _experiments_in(s, Project.id == project_id)
            if held:
                raise ConflictError(
                    f"project {project.name!r} holds {held} experiment(s): move them to "
                    "another project (`assay experiment move`) before deleting it"
                )
            s.delete(project)

    # --- experiments ----------------------------------------------------------------------

    def experiment_place(self, experiment_id: int) -> tuple[int, int]:
        """(workspace id, project id) of an experiment; `NotFoundError` if there is none."""
        found = self.experiment_where(experiment_id)
        return found.workspace_id, found.project_id

    def experiment_where(self, experiment_id: int) -> Placement:
        """Where an experiment is filed, and whose it is; `NotFoundError` if there is none."""
        with self.read() as s:
            row = s.execute(
                select(Project.workspace_id, Project.id, Experiment.owner_id)
                .join(Experiment, Experiment.project_id == Project.id)
                .where(Experiment.id == experiment_id)
            ).first()
            if row is None:
                raise NotFoundError(f"experiment {experiment_id} does not exist")
            return Placement(int(row[0]), int(row[1]), int(row[2]))

    def experiment_workspaces(self, experiment_ids: Collection[int]) -> dict[int, int]:
        """The workspace id of each of `experiment_ids` that exists, by experiment id."""
        if not experiment_ids:
            return {}
        with self.read() as s:
            rows = s.execute(
                select(Experiment.id, Project.workspace_id)
                .join(Project, Project.id == Experiment.project_id)
                .where(Experiment.id.in_(list(experiment_ids)))
            ).all()
            return {int(e): int(w) for e, w in rows}

    def trials_in(self, trial_ids: Collection[int], workspaces: Collection[int]) -> set[int]:
        """Those of `trial_ids` whose experiment is filed in one of `workspaces` (by id)."""
        if not trial_ids or not workspaces:
            return set()
        with self.read() as s:
            rows = s.execute(
                select(Trial.id)
                .join(Experiment, Experiment.id == Trial.experiment_id)
                .join(Project, Project.id == Experiment.project_id)
                .where(Trial.id.in_(list(trial_ids)), Project.workspace_id.in_(list(workspaces)))
            ).scalars()
            return {int(i) for i in rows}

    def experiments_in(
        self, experiment_ids: Collection[int], workspaces: Collection[int]
    ) -> set[int]:
        """Those of `experiment_ids` filed in one of `workspaces` (by id)."""
        if not experiment_ids or not workspaces:
            return set()
        with self.read() as s:
            rows = s.execute(
                select(Experiment.id)
                .join(Project, Project.id == Experiment.project_id)
                .where(
                    Experiment.id.in_(list(experiment_ids)),
                    Project.workspace_id.in_(list(workspaces)),
                )
            ).scalars()
            return {int(i) for i in rows}

    def move_experiment(self, experiment_id: int, project_id: int) -> None:
        with self.write() as s:
            s.execute(
                update(Experiment)
                .where(Experiment.id == experiment_id)
                .values(project_id=project_id)
            )


def _experiments_in(s: Session, where: object) -> int:
    return int(
        s.execute(
            select(func.count())
            .select_from(Experiment)
            .join(Project, Project.id == Experiment.project_id)
            .where(where)  # type: ignore[arg-type]
        ).scalar_one()
    )


def _workspace(s: Session, w: Workspace) -> WorkspaceRecord:
    projects = s.execute(
        select(func.count()).select_from(Project).where(Project.workspace_id == w.id)
    ).scalar_one()
    return WorkspaceRecord(
        w.id, w.name, w.archived, int(projects), _experiments_in(s, Project.workspace_id == w.id)
    )


def _project_query() -> Any:  # Select[Project, str]
    return select(Project, Workspace.name).join(Workspace, Workspace.id == Project.workspace_id)


def _project(s: Session, p: Project, workspace: str, *, counts: bool = True) -> ProjectRecord:
    return ProjectRecord(
        p.id,
        p.workspace_id,
        workspace,
        p.name,
        p.description,
        p.archived,
        _experiments_in(s, Project.id == p.id) if counts else 0,
    )


__all__ = [
    "ROLES",
    "MemberRecord",
    "Placement",
    "ProjectRecord",
    "WorkspaceQueries",
    "WorkspaceRecord",
    "check_name",
    "check_role",
]
