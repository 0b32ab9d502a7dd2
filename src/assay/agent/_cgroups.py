"""Each allocation in a cgroup of its own: limited, and killed as a whole by the kernel.

An allocation's processes join its cgroup in the exec wrapper, as root, before a line of
the user's code runs (`assay.common.spawn`), so everything they start is inside it and cannot
leave (its directories are root's). The cgroup limits their memory (`memory.max`,
`memory.limit_in_bytes`) and their number of processes and threads (`pids.max`: a fork
bomb stops there). When the allocation ends, the agent kills the cgroup and waits until
it is empty, however fast its processes fork, before the allocation counts as ended:

- cgroup v2 (`/sys/fs/cgroup/cgroup.controllers` lists memory and pids): one directory
  per allocation; `cgroup.kill` kills every process in it at once, and forks under way.
- cgroup v1, as many machines still mount it (in "hybrid" mode, with an empty cgroup2
  hierarchy beside the v1 controllers): a directory in each of the memory, pids and
  freezer hierarchies, and one in the cgroup2 hierarchy for its `cgroup.kill` when the
  kernel has it (5.14 and later). Without it: `pids.max` 0 first (no more forks), freeze,
  SIGKILL every process listed, thaw, and again until none is left.

The cgroups go under the agent's own cgroup in each hierarchy, at
`assay/<agent id>/<allocation id>`, so that limits set on the agent's service hold for
its trials too and agents on one machine never touch each other's. At its start an agent
kills and removes what an earlier run of itself left there. On cgroup v2 the controllers
must be enabled for the agent's cgroup's children, which the kernel allows only in a
cgroup without processes of its own: an agent alone in its cgroup (a systemd service with
`Delegate=yes`) moves itself into a leaf, `assay-agent`; otherwise the agent's cgroups go
under the hierarchy's root.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import signal
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("assay.agent")

# The leaf an agent alone in its cgroup v2 moves itself into (see the module's docstring).
SUPERVISOR = "assay-agent"
KILL_TIMEOUT = 10.0  # seconds to wait for a killed cgroup to be empty, per attempt
_FREEZE_TIMEOUT = 2.0
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


class CgroupError(RuntimeError):
    """The agent cannot put allocations in cgroups here; the message says what to do."""


@dataclass(frozen=True)
class Limits:
    """What an allocation may use: bytes of memory, processes and threads (None: no limit)."""

    memory: int | None = None
    pids: int | None = None


@dataclass(frozen=True)
class Allowance:
    """What the agent gives its allocations: at most `memory` bytes to one (its
    `allocation_memory`), and `pids_per_slot` processes and threads per slot (0: no limit)."""

    memory: int
    pids_per_slot: int = 0

    def limits(self, slots: int, memory_per_slot: int | None) -> Limits:
        """An allocation's limits: `memory_per_slot` (its config's resources.memory, None
        when unset) times its `slots` here, at most `memory`."""
        asked = memory_per_slot * slots if memory_per_slot is not None else self.memory
        return Limits(min(asked, self.memory), self.pids_per_slot * slots or None)


@dataclass(frozen=True)
class _Mount:
    """One mounted cgroup hierarchy."""

    path: Path  # where it is mounted
    root: str  # the cgroup shown at its top ("/" unless in a namespace or a bind mount)
    version: int  # 1 or 2
    controllers: frozenset[str]  # v1: the controllers it holds


def _unescape(field: str) -> str:
    """A path of /proc/self/mountinfo, whose spaces and the like are octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def read_mounts(mountinfo: str) -> list[_Mount]:
    """The cgroup hierarchies in a /proc/<pid>/mountinfo text, first mount of each first."""
    found: list[_Mount] = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        tail = fields[fields.index("-") + 1 :]
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        options = frozenset(tail[2].split(","))
        found.append(
            _Mount(
                path=Path(_unescape(fields[4])),
                root=_unescape(fields[3]),
                version=2 if tail[0] == "cgroup2" else 1,
                controllers=options if tail[0] == "cgroup" else frozenset(),
            )
        )
    return found


def read_own(proc_cgroup: str) -> dict[str, str]:
    """The cgroup of a process in each hierarchy, from /proc/<pid>/cgroup: by controller
    for v1 ("memory", "pids", ...), and "" for the v2 hierarchy."""
    own: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if not number or not path:
            continue
        for name in controllers.split(",") if controllers else [""]:
            own.setdefault(name, path)
    return own


def _own_directory(mount: _Mount, own: str | None) -> Path:
    """The directory of our own cgroup in `mount` (its top, if the mount does not show it)."""
    if own is None:
        return mount.path
    root = mount.root.rstrip("/") + "/"
    if own != mount.root and not own.startswith(root):
        return mount.path
    inner = own[len(mount.root) :].strip("/")
    return mount.path / inner if inner else mount.path


def safe_name(agent_id: str) -> str:
    """`agent_id` as one directory name: safe characters only, at most 100 of them."""
    name = _UNSAFE.sub("_", agent_id).lstrip(".") or "_"
    if name != agent_id or len(name) > 100:
        digest = hashlib.sha256(agent_id.encode()).hexdigest()[:8]
        name = f"{name[:91]}-{digest}"
    return name


def _write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _read_pids(folder: Path) -> set[int]:
    try:
        return {int(x) for x in (folder / "cgroup.procs").read_text().split()}
    except FileNotFoundError:
        return set()


@dataclass(frozen=True)
class _Layout:
    """The agent's directory in each hierarchy it uses (the allocations' parents)."""

    memory: Path
    pids: Path
    freezer: Path | None  # v1's freezer hierarchy; cgroup.freeze on v2
    killer: Path | None  # in a cgroup2 hierarchy whose cgroups have cgroup.kill
    v2: bool  # memory, pids and the kill in one cgroup2 directory

    @property
    def bases(self) -> list[Path]:
        out: list[Path] = []
        for folder in (self.memory, self.pids, self.freezer, self.killer):
            if folder is not None and folder not in out:
                out.append(folder)
        return out


class Cgroup:
    """One allocation's cgroup: a directory in each hierarchy, joined by its processes."""

    def __init__(self, layout: _Layout, name: str, limits: Limits = Limits()) -> None:
        self.name = name
        self.limits = limits
        self._v2 = layout.v2
        self._memory = layout.memory / name
        self._pids = layout.pids / name
        self._freezer = layout.freezer / name if layout.freezer is not None else None
        self._killer = layout.killer / name if layout.killer is not None else None
        self.dirs = tuple(base / name for base in layout.bases)

    def make(self) -> None:
        """Create the directories and set the limits; a failure removes what was made."""
        try:
            for folder in self.dirs:
                folder.mkdir(mode=0o755)
            memory, pids = self.limits.memory, self.limits.pids
            if memory is not None:
                limit = "memory.max" if self._v2 else "memory.limit_in_bytes"
                _write(self._memory / limit, str(memory))
                # No swap beyond it (where the kernel accounts swap): a trial past its
                # memory would otherwise swap, and slow every other trial here with it.
                swap = self._memory / (
                    "memory.swap.max" if self._v2 else "memory.memsw.limit_in_bytes"
                )
                if swap.exists():
                    _write(swap, "0" if self._v2 else str(memory))
            if pids is not None:
                _write(self._pids / "pids.max", str(pids))
        except OSError:
            self.remove()
            raise

    def processes(self) -> set[int]:
        """The processes in it now (never a zombie: the kernel lists only live ones)."""
        found: set[int] = set()
        for folder in self.dirs:
            found |= _read_pids(folder)
        return found

    def oom_kills(self) -> int:
        """How many of its processes the kernel killed for reaching its memory limit."""
        name = "memory.events" if self._v2 else "memory.oom_control"
        try:
            text = (self._memory / name).read_text()
        except FileNotFoundError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        # A v1 kernel before 4.13 does not count its kills: the limit was reached, at least.
        with contextlib.suppress(OSError, ValueError):
            return min(1, int((self._memory / "memory.failcnt").read_text()))
        return 0

    def kill(self, timeout: float = KILL_TIMEOUT) -> bool:
        """SIGKILL every process in it until it is empty; False if some still live after
        `timeout` seconds (one in uninterruptible sleep: a hung file system)."""
        deadline = time.monotonic() + timeout
        # No more forks from here on: what is listed below is all there is to kill.
        with contextlib.suppress(OSError):
            _write(self._pids / "pids.max", "0")
        while True:
            if not self.processes():
                return True
            if self._killer is not None and (self._killer / "cgroup.kill").exists():
                _write(self._killer / "cgroup.kill", "1")
            else:
                self._kill_frozen()
            if self._wait_empty(min(deadline, time.monotonic() + 1.0)):
                return True
            if time.monotonic() >= deadline:
                return False

    def _kill_frozen(self) -> None:
        """Freeze, SIGKILL every process listed, thaw: none can fork meanwhile."""
        with self._frozen():
            for pid in self.processes():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    @contextlib.contextmanager
    def _frozen(self) -> Iterator[None]:
        folder = self._freezer
        if folder is None:
            yield
            return
        state, frozen, thawed = (
            ("cgroup.freeze", "1", "0") if self._v2 else ("freezer.state", "FROZEN", "THAWED")
        )
        try:
            _write(folder / state, frozen)
            deadline = time.monotonic() + _FREEZE_TIMEOUT
            while not self._is_frozen(folder) and time.monotonic() < deadline:
                time.sleep(0.001)
            yield
        finally:
            with contextlib.suppress(OSError):
                _write(folder / state, thawed)  # the SIGKILLs are delivered now

    def _is_frozen(self, folder: Path) -> bool:
        if self._v2:
            return "frozen 1" in (folder / "cgroup.events").read_text()
        return (folder / "freezer.state").read_text().strip() == "FROZEN"

    def _wait_empty(self, until: float) -> bool:
        pause = 0.001
        while self.processes():
            if time.monotonic() >= until:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.02)
        return True

    def remove(self) -> bool:
        """Remove its directories (it must be empty); False if one could not be."""
        removed = True
        for folder in self.dirs:
            try:
                folder.rmdir()
            except FileNotFoundError:
                pass
            except OSError as e:
                log.warning("cannot remove the cgroup %s: %s", folder, e.strerror or e)
                removed = False
        return removed


class Cgroups:
    """Where this agent's allocations get their cgroups (see the module's docstring)."""

    def __init__(self, layout: _Layout, description: str) -> None:
        self._layout = layout
        self.description = description

    @classmethod
    def open(
        cls,
        agent_id: str,
        *,
        mountinfo: str | None = None,
        proc_cgroup: str | None = None,
    ) -> Cgroups:
        """The agent's cgroups on this machine, its directories made; `CgroupError`
        saying what to do when it cannot make them (not root, read-only, no memory or pids
        controller). `mountinfo` and `proc_cgroup` replace /proc/self's (tests)."""
        if mountinfo is None:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        if proc_cgroup is None:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        layout, description = _find_layout(read_mounts(mountinfo), read_own(proc_cgroup))
        name = safe_name(agent_id)
        layout = _Layout(
            memory=layout.memory / "assay" / name,
            pids=layout.pids / "assay" / name,
            freezer=layout.freezer / "assay" / name if layout.freezer else None,
            killer=layout.killer / "assay" / name if layout.killer else None,
            v2=layout.v2,
        )
        try:
            for base in layout.bases:
                base.mkdir(mode=0o755, parents=True, exist_ok=True)
            if layout.v2:  # memory and pids for the children of each level down to ours
                for folder in (layout.memory.parent.parent, layout.memory.parent, layout.memory):
                    _enable_controllers(folder)
        except OSError as e:
            raise CgroupError(
                f"cannot make the agent's cgroups ({e.strerror or e}: {e.filename or ''}): "
                "run the agent as root with a writable /sys/fs/cgroup (under systemd: "
                "Delegate=yes and no ProtectControlGroups=), or set cgroups: off"
            ) from None
        if layout.killer is not None and not (layout.killer / "cgroup.kill").exists():
            # A kernel before 5.14: freeze and kill instead.
            with contextlib.suppress(OSError):
                layout.killer.rmdir()
            layout = _Layout(layout.memory, layout.pids, layout.freezer, None, layout.v2)
            description += ", without cgroup.kill"
        return cls(layout, description)

    @property
    def directories(self) -> list[Path]:
        """The agent's directory in each hierarchy (its allocations' cgroups are inside)."""
        return self._layout.bases

    def create(self, name: str, limits: Limits) -> Cgroup:
        """A new, empty cgroup for allocation `name`, with `limits` (one left by an
        earlier allocation of the same name is killed and removed first)."""
        cgroup = Cgroup(self._layout, name, limits)
        if any(folder.exists() for folder in cgroup.dirs):
            cgroup.kill()
            cgroup.remove()
        cgroup.make()
        return cgroup

    def leftovers(self) -> list[str]:
        """Names of the cgroups in the agent's directories (its allocations' cgroups)."""
        names: set[str] = set()
        for base in self._layout.bases:
            with contextlib.suppress(FileNotFoundError):
                names.update(p.name for p in base.iterdir() if p.is_dir())
        return sorted(names)

    def close(self) -> None:
        """Remove the agent's directories if no allocation's cgroup is left in them."""
        for base in self._layout.bases:
            with contextlib.suppress(OSError):
                base.rmdir()

    def clean(self) -> int:
        """Kill and remove what an earlier run of this agent left; how many processes."""
        killed = 0
        for name in self.leftovers():
            cgroup = Cgroup(self._layout, name)
            found = len(cgroup.processes())
            if not cgroup.kill():
                log.error(
                    "processes %s of an earlier allocation %s outlived SIGKILL for %g s",
                    sorted(cgroup.processes()),
                    name,
                    KILL_TIMEOUT,
                )
            cgroup.remove()
            killed += found
        if killed:
            log.warning("killed %d process(es) left by an earlier run of this agent", killed)
        return killed


def _enable_controllers(folder: Path) -> None:
    _write(folder / "cgroup.subtree_control", "+memory +pids")


def _find_layout(mounts: Iterable[_Mount], own: dict[str, str]) -> tuple[_Layout, str]:
    """Where the agent's cgroups go: each hierarchy's directory of the agent's own cgroup
    (before "assay/<agent>"), and what that is in words."""
    mounts = list(mounts)
    v2 = next((m for m in mounts if m.version == 2), None)
    if v2 is not None:
        controllers = set((v2.path / "cgroup.controllers").read_text().split())
        if {"memory", "pids"} <= controllers:
            parent = _v2_parent(v2, _own_directory(v2, own.get("")))
            return _Layout(parent, parent, parent, parent, v2=True), "cgroup v2"
    v1 = {}
    for name in ("memory", "pids", "freezer"):
        mount = next((m for m in mounts if m.version == 1 and name in m.controllers), None)
        if mount is not None:
            v1[name] = _own_directory(mount, own.get(name))
    if "memory" not in v1 or "pids" not in v1:
        raise CgroupError(
            "this machine mounts no cgroup hierarchy with the memory and pids controllers "
            "(cgroup v2 at /sys/fs/cgroup, or v1's memory and pids): mount them, or set "
            "cgroups: off"
        )
    killer = _own_directory(v2, own.get("")) if v2 is not None else None
    parts = ", ".join(n for n in ("memory", "pids", "freezer") if n in v1)
    how = "cgroup.kill of the cgroup2 hierarchy" if killer else "freeze and SIGKILL"
    layout = _Layout(v1["memory"], v1["pids"], v1.get("freezer"), killer, v2=False)
    return layout, f"cgroup v1 ({parts}; killed by {how})"


def _v2_parent(mount: _Mount, own: Path) -> Path:
    """The cgroup v2 directory whose children may have memory and pids limits: the agent's
    own cgroup (emptied of the agent, which moves into a leaf) or the hierarchy's root."""
    if own.name == SUPERVISOR and own.parent != own:
        return own.parent  # moved there by an earlier start in this process
    if own == mount.path:
        return own
    try:
        _enable_controllers(own)
        return own
    except OSError as e:
        if e.errno != errno.EBUSY:
            return mount.path
    if _read_pids(own) == {os.getpid()}:
        leaf = own / SUPERVISOR
        with contextlib.suppress(OSError):
            leaf.mkdir(exist_ok=True)
            _write(leaf / "cgroup.procs", str(os.getpid()))
            _enable_controllers(own)
            log.info("moved the agent into %s, to give its allocations cgroups of their own", leaf)
            return own
    return mount.path


__all__ = ["KILL_TIMEOUT", "Allowance", "Cgroup", "CgroupError", "Cgroups", "Limits", "safe_name"]
