"""The directory: an in-memory copy of the workspaces, their projects and the membership.

Every submission and every role check asks which workspace a name is, which of its
projects a name is, and the caller's role there; read from the database each time, that
was the master's costliest step per submission (an ORM query or three, each a
transaction, on every CreateExperiment). The copy answers from memory.

It is dropped by every write of this store that changes what it holds (a workspace, a
project, a membership or a pool's binding created, archived, changed or deleted; a user
created, who joins the Default workspace), after that write commits, so the next read of this
process sees the change; and it is read again after `ttl_s` in any case, so a write by
another process on the same database (another master, a tool) is seen within that, as
the session cache of _auth.py does for tokens. A reader that loaded while a write
committed keeps its copy only if no write came in between (the generation it read
first is still current).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from assay.master.store._records import ProjectRecord, WorkspaceRecord

TTL_S = 5.0


@dataclass(frozen=True)
class Snapshot:
    """What the directory holds (records without counts: they are left 0)."""

    workspaces: dict[int, WorkspaceRecord] = field(default_factory=dict)
    by_name: dict[str, WorkspaceRecord] = field(default_factory=dict)
    # (workspace id, project name) -> project
    projects: dict[tuple[int, str], ProjectRecord] = field(default_factory=dict)
    # user id -> workspace id -> role
    roles: dict[int, dict[int, str]] = field(default_factory=dict)
    # resource pool -> the ids of the workspaces an administrator bound it to
    pools: dict[str, frozenset[int]] = field(default_factory=dict)

    def project_by_names(
        self, workspace: str, project: str, visible: Collection[int] | None = None
    ) -> tuple[WorkspaceRecord, ProjectRecord] | None:
        """Workspace `workspace` (among `visible`, if given) and its project `project`;
        None if either is not there."""
        found = self.by_name.get(workspace)
        if found is None or (visible is not None and found.id not in visible):
            return None
        chosen = self.projects.get((found.id, project))
        return None if chosen is None else (found, chosen)


class Directory:
    """The current `Snapshot`, loaded by `load` when a write or `ttl_s` made it stale.
    Safe to call from any thread; a hit does no I/O."""

    def __init__(
        self,
        load: Callable[[], Snapshot],
        *,
        ttl_s: float = TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._load = load
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._generation = 0  # bumped by every change
        # (snapshot, the generation it was loaded at, when)
        self._current: tuple[Snapshot, int, float] | None = None

    def changed(self) -> None:
        """A write of this process changed what the directory holds (call after it commits)."""
        with self._lock:
            self._generation += 1
            self._current = None

    def fresh(self) -> bool:
        """Whether `get()` answers from memory (no I/O) now."""
        return self.cached() is not None

    def cached(self) -> Snapshot | None:
        """The snapshot `get()` would answer from memory now, or None (no I/O either way):
        one consistent copy for a caller that must not wait on the database."""
        return self._hit(self._current, self._clock())

    def _hit(self, current: tuple[Snapshot, int, float] | None, now: float) -> Snapshot | None:
        """`current`'s snapshot if no change came since it was loaded and `ttl_s` has not
        passed, else None."""
        if current is None or current[1] != self._generation:
            return None
        return current[0] if 0 <= now - current[2] < self._ttl_s else None

    def get(self) -> Snapshot:
        now = self._clock()
        hit = self._hit(self._current, now)
        if hit is not None:
            return hit
        with self._lock:
            generation = self._generation
        snapshot = self._load()
        with self._lock:
            if self._generation == generation:  # no change committed while it loaded
                self._current = (snapshot, generation, now)
        return snapshot


__all__ = ["TTL_S", "Directory", "Snapshot"]
