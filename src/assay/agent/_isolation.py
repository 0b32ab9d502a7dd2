"""Each allocation in a sandbox of its own: a Unix user the agent lends it for its life.

With `isolation: uid` (the default for an agent running as root) every allocation's
processes run as a uid of their own, taken from a range no account on the machine
uses (`isolation_uid_base`, `isolation_uids`), and as a gid per experiment from the same
range, so the trials of one experiment share its checkpoints and nothing else. What
that gives, enforced by the kernel rather than by Assay:
- another allocation's processes cannot be signalled, traced or read (`/proc/<pid>/
  environ`, `mem`, `fd` need the same uid), nor its directory (0700, its own uid);
- the agent's directory, settings file and environment, and a co-located master's state
  directory, belong to the agent's and master's users: unreadable;
- the processes get a clean environment (`environment_for`): the agent's own variables
  never reach them, and descriptors are never inherited (close_fds);
- an experiment's shared_fs directory, `<checkpoint root>/<experiment id>`, is made by
  the agent before the first allocation of the experiment starts here, root's and the
  experiment's group's, 2770 (`give_experiment_directory`): its trials write their
  checkpoints and TensorBoard files there (group-writable: umask 007, setgid keeps the
  group), another experiment's trials can neither list, read nor write it, and the root
  above it is only traversed (the master makes its own 0711).
A uid is handed out round-robin, so one comes back only after every other in the range;
the turn is kept in `<lock_dir>.next` (`/run/assay/uids.next`), which the agents of the
machine share, so an agent that restarts goes on from there rather than from the first
uid. A uid under which any process still lives (one a trial left behind, that outlived
an agent killed meanwhile) is never lent: it is skipped, and what lives under it killed.
When an allocation ends, every process still running under its uid is killed, until none
is left: by `kill(-1, SIGKILL)` sent as that uid, which reaches all of them at once, so
one that forks every millisecond cannot slip through (with cgroups, its cgroup is killed
first; see `_cgroups`). Agents on one machine share the range
(and must: an experiment's gid is the same on every agent of the cluster), so a uid is
claimed on the machine, not only in the agent: by an exclusive lock on
`<lock_dir>/<uid>` (`/run/assay/uids`, root's), held for the allocation's life and
released by the kernel if the agent dies. Another agent's uid is never lent, so its
trials are never killed as leftovers.

This is what Slurm's and Determined's agents get from running each job as its user or in
a container; a uid per allocation needs neither user accounts nor a container runtime.
`isolation: none` runs every trial as the agent's own user: single-tenant, said loudly.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import stat
import struct
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from assay.common.spawn import dying_with

log = logging.getLogger("assay.agent")

# Variables a trial's environment keeps from the agent's when isolated: what finds the
# Python and the libraries it runs, the locale, and Assay's own switches for the harness
# (its secrets excepted). The config's environment_variables and the launch's own come
# on top.
_KEPT_NAMES = frozenset(
    {"PATH", "LANG", "LANGUAGE", "TZ", "TERM", "VIRTUAL_ENV", "PYTHONPATH", "LD_LIBRARY_PATH"}
)
_KEPT_PREFIXES = ("LC_", "ASSAY_", "CUDA_", "NCCL_", "NVIDIA_", "OMP_", "MKL_", "TORCH_")
# Where the agents of one machine claim their uids (tmpfs: cleared with the processes).
DEFAULT_LOCK_DIR = Path("/run/assay/uids")


@dataclass(frozen=True)
class Identity:
    """Who an allocation's processes run as: `uid`, and `gid` (its experiment's)."""

    uid: int
    gid: int


class Isolation:
    """Lends uids to allocations (thread-safe). `mode` "none" lends nothing."""

    def __init__(
        self, mode: str, uid_base: int, uids: int, lock_dir: Path = DEFAULT_LOCK_DIR
    ) -> None:
        if mode not in ("uid", "none"):
            raise ValueError(f"isolation must be uid or none, got {mode!r}")
        if mode == "uid" and os.geteuid() != 0:
            raise PermissionError(
                "isolation: uid needs the agent to run as root (it switches each "
                "allocation's processes to a uid of their own); run it as root, e.g. with "
                "deploy/install-agent.sh, or set isolation: none on a machine only you use"
            )
        self.mode = mode
        self._base = uid_base
        self._count = uids
        self._lock_dir = lock_dir
        self._turn = lock_dir.with_name(lock_dir.name + ".next")  # the next uid's offset
        self._lock = threading.Lock()
        self._lent: dict[int, int] = {}  # uid -> the descriptor holding its machine lock

    @property
    def enabled(self) -> bool:
        return self.mode == "uid"

    def lend(self, allocation_id: str, experiment_id: int) -> Identity | None:
        """A uid of its own for the allocation (None without isolation): the next in turn
        that neither this agent nor another on the machine holds, and under which no
        process lives."""
        if not self.enabled:
            return None
        with self._lock, self._turn_of_machine() as turn:
            uid = self._next_free(turn)
        log.debug("allocation %s runs as uid %d", allocation_id, uid)
        return Identity(uid, self.group_of(experiment_id))

    def _next_free(self, turn: _Turn) -> int:
        start = turn.read() % self._count
        for step in range(self._count):
            uid = self._base + (start + step) % self._count
            if uid in self._lent:
                continue
            claim = self._claim(uid)
            if claim is None:
                continue
            living = processes_of(uid)
            if living:
                log.warning(
                    "uid %d is not lent: %d process(es) of an earlier allocation still run as "
                    "it (%s); killing them",
                    uid,
                    len(living),
                    ", ".join(map(str, sorted(living)[:10])),
                )
                kill_processes_of(uid)
                self._release(uid, claim)
                continue
            # A process that forks faster than /proc is read escapes that look; this
            # reaches it all the same (and being no process stuck in the kernel, which
            # the look would have seen, it is gone at once).
            _kill_all_as(uid)
            self._lent[uid] = claim
            turn.write((start + step + 1) % self._count)
            return uid
        raise RuntimeError(
            f"all {self._count} isolation uids are in use (by this agent and the other "
            "agents on this machine, or by processes left running); raise isolation_uids"
        )

    @contextlib.contextmanager
    def _turn_of_machine(self) -> Iterator[_Turn]:
        """The machine's turn, locked against the other agents here while it is read
        and moved on."""
        self._lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self._turn, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield _Turn(fd)
        finally:
            os.close(fd)

    def _claim(self, uid: int) -> int | None:
        """Lock `uid` on this machine: the lock's descriptor, or None if another agent
        here holds it. Its file exists only while it is held (`give_back` removes it),
        so the directory never grows past the uids in use; a lock taken on a file its
        holder removed meanwhile is not the uid's, and the claim starts again."""
        self._lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self._lock_dir / str(uid)
        for _ in range(8):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return None
            try:
                current = os.lstat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                current = False
            if current:
                return fd
            os.close(fd)  # released and removed while we waited: try the new file
        return None

    def group_of(self, experiment_id: int) -> int:
        """The gid the trials of an experiment share (for its checkpoints)."""
        return self._base + experiment_id % self._count

    def give_experiment_directory(self, path: Path, experiment_id: int) -> None:
        """Make `path` experiment `experiment_id`'s directory in shared_fs storage: root's
        and the experiment's group's, mode 2770 (nothing without isolation: the harness
        makes it then). Its parent, the storage root, must exist.

        A directory already there is taken only when it is exactly that (made so by an
        earlier allocation); anything else is refused with what to do, never changed: the
        path comes from a user's config, and root must not hand a directory it did not
        make to a group of trials. Raises `OSError` with the reason.
        """
        if not self.enabled:
            return
        gid = self.group_of(experiment_id)
        if not path.parent.is_dir():
            raise FileNotFoundError(
                f"the checkpoint storage root {path.parent} does not exist on this agent: "
                "mount it (shared_fs is a directory every machine mounts at the same path)"
            )
        self._check_storage_root(path.parent)
        try:
            path.mkdir(mode=0o700)
            made = True
        except FileExistsError:
            made = False
        # By descriptor, never following a link: what is changed is what was checked.
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            if made:
                os.fchown(fd, 0, gid)
                os.fchmod(fd, 0o2770)
                _let_in(fd, path.parent.stat().st_uid, path)
                return
            found = os.fstat(fd)
            mode = stat.S_IMODE(found.st_mode)
            if (found.st_uid, found.st_gid, mode) != (0, gid, 0o2770):
                raise PermissionError(
                    f"{path} is there already, owned by {found.st_uid}:{found.st_gid} with "
                    f"mode {mode:o}, and is not experiment {experiment_id}'s directory (root:"
                    f"{gid}, 2770): an administrator checks what is in it, then removes it "
                    f"or runs `chown root:{gid} {path} && chmod 2770 {path}`"
                )
        finally:
            os.close(fd)

    def _check_storage_root(self, root: Path) -> None:
        """Refuse a storage root that root would reach through a symbolic link, or that
        lies inside an experiment's directory: trials may write there (a link of theirs
        would aim root's mkdir anywhere, e.g. /etc)."""
        real = os.path.realpath(root)
        if real != os.path.normpath(root):
            raise PermissionError(
                f"the checkpoint storage root {root} goes through a symbolic link (to "
                f"{real}): name the real path in checkpoint_storage.host_path (and in the "
                "master's shared_fs_host_paths)"
            )
        for folder in (Path(real), *Path(real).parents):
            found = os.lstat(folder)
            mode = stat.S_IMODE(found.st_mode)
            ours = self._base <= found.st_gid < self._base + self._count
            if found.st_uid == 0 and mode == 0o2770 and ours:
                raise PermissionError(
                    f"the checkpoint storage root {root} is inside {folder}, an experiment's "
                    "checkpoint directory: give checkpoint_storage a host_path of its own"
                )

    def give_back(self, identity: Identity | None) -> None:
        """The allocation ended: whatever still runs as its uid is killed, then the uid
        may be lent again (unless something outlived even that)."""
        if identity is None:
            return
        kill_processes_of(identity.uid)
        with self._lock:
            claim = self._lent.pop(identity.uid, None)
        if claim is not None:
            self._release(identity.uid, claim)

    def _release(self, uid: int, claim: int) -> None:
        # Removed while still locked, then released: another agent here may lend it.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._lock_dir / str(uid))
        os.close(claim)

    def environment_for(self, env: Mapping[str, str], home: Path) -> dict[str, str]:
        """The agent's environment as an allocation's processes start from it."""
        if not self.enabled:
            return dict(env)
        kept = {k: v for k, v in env.items() if k in _KEPT_NAMES or k.startswith(_KEPT_PREFIXES)}
        tmp = str(home / "tmp")
        kept.update(HOME=str(home), TMPDIR=tmp, USER="assay-trial", LOGNAME="assay-trial")
        return kept

    def hand_over(self, path: Path, identity: Identity | None) -> None:
        """Give `path` and everything under it to the allocation's uid (its own only)."""
        if identity is None:
            return
        (path / "tmp").mkdir(exist_ok=True)
        for root, dirs, files in os.walk(path):
            for name in (*dirs, *files):
                os.lchown(os.path.join(root, name), identity.uid, identity.gid)
        os.chown(path, identity.uid, identity.gid)
        path.chmod(0o700)


# POSIX ACLs as Linux stores them in an extended attribute (acl(5), posix_acl_xattr.h):
# a version, then (tag, permissions, id) entries in tag order.
_ACL_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
_NO_ID = 0xFFFFFFFF


def _acl(uid: int) -> bytes:
    """Owner, group and the named user `uid` rwx; others nothing."""
    entries = [
        (_USER_OBJ, 7, _NO_ID),
        (_USER, 7, uid),
        (_GROUP_OBJ, 7, _NO_ID),
        (_MASK, 7, _NO_ID),
        (_OTHER, 0, _NO_ID),
    ]
    return struct.pack("<I", _ACL_VERSION) + b"".join(
        struct.pack("<HHI", tag, perm, ident) for tag, perm, ident in entries
    )


def _let_in(fd: int, uid: int, path: Path) -> None:
    """Let the storage root's owner (the master, which made it) into an experiment's
    directory and everything its trials write there, by an access and a default ACL, so
    that garbage collection deletes what isolated trials wrote. Root needs none."""
    if uid == 0:
        return
    acl = _acl(uid)
    try:
        os.setxattr(fd, "system.posix_acl_access", acl)
        os.setxattr(fd, "system.posix_acl_default", acl)
    except OSError as e:
        log.warning(
            "cannot give %s's owner (uid %d) access to %s (%s): the master can delete what "
            "isolated trials write there only if it runs as root",
            path.parent,
            uid,
            path,
            e.strerror or e,
        )


@dataclass(frozen=True)
class _Turn:
    """The offset of the next uid to lend, in a file the agents of a machine share."""

    fd: int

    def read(self) -> int:
        os.lseek(self.fd, 0, os.SEEK_SET)
        text = os.read(self.fd, 64).decode(errors="replace").strip()
        return int(text) if text.isdigit() else 0

    def write(self, offset: int) -> None:
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{offset}\n".encode(), 0)


def processes_of(uid: int) -> set[int]:
    """The live processes (zombies aside) whose real, effective or saved uid is `uid`."""
    found = set()
    for proc in psutil.process_iter(["uids", "status"]):
        uids = proc.info.get("uids")
        if proc.info.get("status") == psutil.STATUS_ZOMBIE or uids is None:
            continue  # a zombie is dead already, waiting for its parent to reap it
        if uid in (uids.real, uids.effective, uids.saved):
            found.add(proc.pid)
    return found


# Run as the uid: kill(-1) signals every process the sender may signal, i.e. all those
# of its uid, in one pass of the kernel that a fork cannot race (a process being killed
# cannot fork), except the sender itself. The shell's own `kill`: any uid can run it.
_KILL_ALL = ["/bin/sh", "-c", "kill -KILL -1 2>/dev/null; exit 0"]


def _kill_all_as(uid: int) -> None:
    subprocess.run(dying_with(_KILL_ALL, os.getpid(), (uid, uid)), check=False, timeout=60)


def kill_processes_of(uid: int, timeout: float = 10.0) -> bool:
    """SIGKILL every process running as `uid`, however fast they fork, and wait until
    none is left (zombies aside); False if one still lives after `timeout` seconds (in
    uninterruptible sleep: it waits for its I/O)."""
    deadline = time.monotonic() + timeout
    while True:
        _kill_all_as(uid)
        pause = 0.001
        until = min(deadline, time.monotonic() + 1.0)
        while left := processes_of(uid):
            if time.monotonic() >= until:
                break
            time.sleep(pause)
            pause = min(2 * pause, 0.05)
        if not left:
            return True
        if time.monotonic() >= deadline:
            log.error(
                "processes %s of uid %d outlived SIGKILL for %g s", sorted(left), uid, timeout
            )
            return False


__all__ = ["Identity", "Isolation", "kill_processes_of", "processes_of"]
