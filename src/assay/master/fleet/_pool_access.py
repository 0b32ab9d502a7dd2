"""Which workspaces may use each resource pool (Determined's workspace-pool bindings).

A pool is bound to workspaces by the master's settings (`resource_pools[].workspaces`)
and by administrators at run time (`assay resource-pool bind POOL WORKSPACE`, kept in
the store). A pool with no binding is open to every workspace. A bound pool takes
experiments of its bound workspaces only:

- a submission (create, fork) filed in another workspace is refused, naming the pool
  and the workspaces that may use it; so is moving a live experiment to such a
  workspace, and continuing an ended one there;
- the trials of a live experiment whose workspace may not use its pool (a binding
  added or removed since it was submitted) are not placed: they wait, and the queue
  says why, until the experiment is moved or its workspace is bound. Allocations that
  run when a binding changes run on to their end, as in Determined, where a binding
  stops nothing that runs.

A workspace named by the settings is made at start when it does not exist (with no
members), so no user can claim the name by creating it; it cannot be deleted while the
settings name it. Settings bindings cannot be removed with `unbind`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from assay.master.errors import (
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
)
from assay.master.fleet._pool_config import pool_workspaces
from assay.master.store import Snapshot, Store, WorkspaceRecord

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from assay.master.lifecycle import ExperimentState


class Settings(Protocol):
    """What the bindings read of the master's settings (`MasterConfig`)."""

    @property
    def default_resource_pool(self) -> str: ...

    @property
    def resource_pools(self) -> list[dict[str, Any]]: ...


class _Memory(Protocol):
    """What holding back reads and changes of the interpreter's memory."""

    barred: dict[str, str]

    def schedule(self) -> None: ...


class Shell(Protocol):
    """What holding back uses of the master (`Master`): its lock, live experiments and
    memory, and the wait for its changes to be committed."""

    @property
    def lock(self) -> AbstractContextManager[Any]: ...

    @property
    def experiments(self) -> Mapping[int, ExperimentState]: ...

    @property
    def interpreter(self) -> _Memory: ...

    def commit_and_wait(self) -> None: ...


@dataclass(frozen=True)
class Binding:
    """A workspace whose experiments may use a pool, and whether the settings say so."""

    workspace: str
    from_settings: bool


class PoolAccess:
    """The bindings of the settings (resolved to workspace ids once, at start) and of the
    store (read from its directory, an in-memory copy), and the checks made of them.
    `generation` counts the changes made here (`bind`, `unbind`)."""

    def __init__(self, store: Store, config: Settings, pools: Sequence[str]) -> None:
        self.store = store
        self.default = config.default_resource_pool
        self.pools = tuple(pools)
        self.settings: dict[str, frozenset[int]] = {
            pool: frozenset(store.settings_workspace(name).id for name in names)
            for pool, names in pool_workspaces(config.resource_pools).items()
        }
        self.generation = 0

    def pool_of(self, raw: Mapping[str, Any]) -> str:
        """The pool an experiment's config (as stored) runs in."""
        resources = raw.get("resources")
        pool = resources.get("resource_pool") if isinstance(resources, Mapping) else None
        return str(pool) if pool else self.default

    def allowed(self, pool: str, snapshot: Snapshot) -> frozenset[int] | None:
        """The ids of the workspaces that may use `pool` (None: every workspace)."""
        bound = self.settings.get(pool, frozenset()) | snapshot.pools.get(pool, frozenset())
        return bound or None

    def refusal(
        self, pool: str, workspace_id: int, snapshot: Snapshot, *, waiting: bool = False
    ) -> str | None:
        """Why experiments of the workspace may not use `pool` (None: they may).
        `waiting`: worded for the trials of a live experiment that wait for it."""
        allowed = self.allowed(pool, snapshot)
        if allowed is None or workspace_id in allowed:
            return None
        names = ", ".join(sorted(repr(_name(snapshot, w)) for w in allowed))
        here = _name(snapshot, workspace_id)
        bound = f"pool {pool!r} is bound to workspace{'s' if len(allowed) > 1 else ''} {names}"
        if waiting:
            return (
                f"{bound}, and this experiment is in workspace {here!r}: move it to one "
                f"of those, or ask an administrator to bind the pool to {here!r}"
            )
        return (
            f"resources.resource_pool: {bound}; experiments of workspace {here!r} may not "
            "use it (file the experiment in one of those workspaces, choose another pool, "
            f"or ask an administrator: `assay resource-pool bind {pool} {here}`)"
        )

    def check(self, raw: Mapping[str, Any], workspace_id: int, snapshot: Snapshot) -> None:
        """`PermissionDeniedError` if an experiment with config `raw` may not be filed in
        the workspace, for its pool's bindings."""
        why = self.refusal(self.pool_of(raw), workspace_id, snapshot)
        if why is not None:
            raise PermissionDeniedError(why)

    def may_continue(self, experiment_id: int) -> None:
        """`check` for an ended experiment to continue where it is filed."""
        raw = self.store.get_experiment(experiment_id).config
        workspace_id, _ = self.store.experiment_place(experiment_id)
        self.check(raw, workspace_id, self.store.directory.get())

    def bindings(self, pool: str) -> list[Binding]:
        """The workspaces bound to a declared pool (`NotFoundError` for another name)."""
        self._declared(pool)
        snapshot = self.store.directory.get()
        settings = self.settings.get(pool, frozenset())
        ids = settings | snapshot.pools.get(pool, frozenset())
        found = [Binding(_name(snapshot, w), w in settings) for w in ids]
        return sorted(found, key=lambda b: b.workspace)

    def bind(self, pool: str, workspace: WorkspaceRecord) -> bool:
        """Bind a declared pool to the workspace; False if it was bound already."""
        self._declared(pool)
        if workspace.id in self.settings.get(pool, frozenset()):
            return False
        bound = self.store.bind_pool(pool, workspace.id)
        # After the write: a submission that saw the old generation is checked again.
        self.generation += 1
        return bound

    def unbind(self, pool: str, workspace: WorkspaceRecord) -> None:
        """Remove a binding made by `bind`; the settings' own are refused."""
        self._declared(pool)
        if workspace.id in self.settings.get(pool, frozenset()):
            raise ConflictError(
                f"pool {pool!r} is bound to workspace {workspace.name!r} by the master's "
                "settings (resource_pools[].workspaces): remove it there and restart the "
                "master"
            )
        if not self.store.unbind_pool(pool, workspace.id):
            raise NotFoundError(f"pool {pool!r} is not bound to workspace {workspace.name!r}")
        self.generation += 1

    def named_by_settings(self, workspace_id: int) -> list[str]:
        """The pools the settings bind to the workspace."""
        return sorted(p for p, ids in self.settings.items() if workspace_id in ids)

    def hold_back(self, master: Shell, experiment_ids: Collection[int] | None = None) -> None:
        """Hold back the queued trials of live experiments whose workspace may not use
        their pool, and let go those that now may; of `experiment_ids`, or of every live
        experiment. Reads the store, then changes the master's memory under its lock."""
        snapshot = self.store.directory.get()
        if not (self.settings or snapshot.pools or master.interpreter.barred):
            return  # no pool is bound, and nothing is held back
        live = list(master.experiments) if experiment_ids is None else list(experiment_ids)
        places = self.store.experiment_workspaces(live)
        with master.lock:
            it = master.interpreter
            held = {} if experiment_ids is None else dict(it.barred)
            for experiment_id in live:
                experiment = master.experiments.get(experiment_id)
                workspace_id = places.get(experiment_id)
                why = None
                if experiment is not None and workspace_id is not None:
                    pool = self.pool_of(experiment.config.raw)
                    why = self.refusal(pool, workspace_id, snapshot, waiting=True)
                if why is None:
                    held.pop(str(experiment_id), None)
                else:
                    held[str(experiment_id)] = why
            if held != it.barred:
                it.barred = held
                it.schedule()
                master.commit_and_wait()

    def _declared(self, pool: str) -> None:
        if not pool:
            raise InvalidArgumentError("give a resource pool's name (`assay resource-pool list`)")
        if pool not in self.pools:
            raise NotFoundError(
                f"resource pool {pool!r} does not exist: this master's pools are "
                f"{', '.join(self.pools)} (`assay resource-pool list`)"
            )


def _name(snapshot: Snapshot, workspace_id: int) -> str:
    found = snapshot.workspaces.get(workspace_id)
    return found.name if found is not None else str(workspace_id)


__all__ = ["Binding", "PoolAccess"]
