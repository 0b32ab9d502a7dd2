"""The in-memory store's users and workspaces: what a master asks of them.

A new user is an editor of the Default workspace; a workspace the master's settings
name is made with no members; pools are bound to workspaces. `directory` reads them
from memory as the SQL store's does (_directory.py), dropped by each write here.
"""

from __future__ import annotations

from collections.abc import Collection

from assay.master.errors import NotFoundError
from assay.master.store._directory import Directory, Snapshot
from assay.master.store._memory_tables import DEFAULT_WORKSPACE_ID, MemoryDatabase
from assay.master.store._records import ProjectRecord, WorkspaceRecord
from assay.master.store._workspaces import check_name


class MemoryWorkspaces:
    """Users, workspaces, projects and pool bindings in a `MemoryDatabase`."""

    database: MemoryDatabase
    directory: Directory

    def user_id(self, username: str) -> int:
        """The id of `username`, created if missing: an editor of the Default workspace."""
        with self.database.write() as tx:
            for row in tx["users"].values():
                if row["username"] == username:
                    return int(row["id"])
            user_id = self.database.next_id("users")
            tx.insert("users", user_id, {"id": user_id, "username": username, "admin": False})
            tx.insert("members", (DEFAULT_WORKSPACE_ID, user_id), {"role": "editor"})
        self.directory.changed()
        return user_id

    def experiment_workspaces(self, experiment_ids: Collection[int]) -> dict[int, int]:
        with self.database.read() as db:
            experiments, projects = db["experiments"], db["projects"]
            return {
                e: int(projects[experiments[e]["project_id"]]["workspace_id"])
                for e in experiment_ids
                if e in experiments
            }

    def experiment_place(self, experiment_id: int) -> tuple[int, int]:
        """(workspace id, project id) of an experiment; `NotFoundError` if there is none."""
        with self.database.read() as db:
            experiment = db["experiments"].get(experiment_id)
            if experiment is None:
                raise NotFoundError(f"experiment {experiment_id} does not exist")
            project = db["projects"][experiment["project_id"]]
            return int(project["workspace_id"]), int(project["id"])

    def settings_workspace(self, name: str) -> WorkspaceRecord:
        """The workspace named `name`, made with no members if there is none."""
        check_name("workspace", name)
        found = self.directory.get().by_name.get(name)
        if found is not None:
            return found
        with self.database.write() as tx:
            workspace_id = self.database.next_id("workspaces")
            row = {"id": workspace_id, "name": name, "archived": False}
            tx.insert("workspaces", workspace_id, row)
        self.directory.changed()
        return WorkspaceRecord(workspace_id, name, False)

    def bind_pool(self, pool: str, workspace_id: int) -> bool:
        """Bind the pool to the workspace; False if it was bound already."""
        try:
            with self.database.write() as tx:
                if (pool, workspace_id) in tx["pool_bindings"]:
                    return False
                if workspace_id not in tx["workspaces"]:
                    raise NotFoundError(f"workspace {workspace_id} does not exist")
                tx.insert("pool_bindings", (pool, workspace_id), {})
                return True
        finally:
            self.directory.changed()

    def unbind_pool(self, pool: str, workspace_id: int) -> bool:
        """Whether the pool was bound to the workspace (and is no longer)."""
        with self.database.write() as tx:
            bound = (pool, workspace_id) in tx["pool_bindings"]
            tx.delete("pool_bindings", (pool, workspace_id))
        self.directory.changed()
        return bound

    def _load_directory(self) -> Snapshot:
        snapshot = Snapshot()
        with self.database.read() as db:
            for w in db["workspaces"].values():
                record = WorkspaceRecord(w["id"], w["name"], w["archived"])
                snapshot.workspaces[w["id"]] = snapshot.by_name[w["name"]] = record
            for p in db["projects"].values():
                workspace = snapshot.workspaces[p["workspace_id"]]
                snapshot.projects[(workspace.id, p["name"])] = ProjectRecord(
                    p["id"], workspace.id, workspace.name, p["name"], p["description"], False
                )
            for (workspace_id, user_id), member in db["members"].items():
                snapshot.roles.setdefault(user_id, {})[workspace_id] = member["role"]
            pools: dict[str, set[int]] = {}
            for pool, workspace_id in db["pool_bindings"]:
                pools.setdefault(pool, set()).add(workspace_id)
            snapshot.pools.update((pool, frozenset(ids)) for pool, ids in pools.items())
        return snapshot


__all__ = ["MemoryWorkspaces"]
