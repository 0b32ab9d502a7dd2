"""A child command that dies with its launcher, started without running fork handlers.

`preexec_fn` (or Popen's `user=`) forces a real fork() of the launcher. When the launcher
holds gRPC threads (an agent always does; a `run_local` caller with a client open may),
gRPC's fork handlers now and then abort that child ("epoll_wait error: Bad file
descriptor", SIGABRT) before it runs a line. Without them subprocess uses vfork and runs
no handlers, so the work is done by a small exec wrapper in the child instead. In order:
it joins the cgroups it is given (while still root, before a line of the command runs,
so nothing the command starts is ever outside them) and the network namespace it is
given (by an inherited descriptor; also as root), becomes the given user when there
is one, asks Linux to SIGTERM it when the launching *thread* dies (PR_SET_PDEATHSIG,
which survives exec but is cleared by a user switch, so it comes after), checks the
launcher did not die first, then execs the command.

The wrapper's arguments are option flags, each with one value, then `--` and the
command: `--parent PID` (required), `--user UID:GID`, `--cgroup DIR` (repeated: one per
hierarchy), `--netns FD`. A step added later is one more flag, read before `--`.

Each rank of a trial starts with `torchrun_env`'s variables, whoever launches it (the
agent, `assay trial run-local --slots N`, a script's launcher).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

_EXEC_WITH_PDEATHSIG = """
import ctypes, os, signal, sys
def fail(code, message):
    os.write(2, f"{message}\\n".encode())
    os._exit(code)
options, args = {}, sys.argv[1:]
while args and args[0] != "--":
    if len(args) < 2:
        fail(127, f"the exec wrapper's option {args[0]} has no value")
    options.setdefault(args[0], []).append(args[1])
    args = args[2:]
command = args[1:]
unknown = set(options) - {"--parent", "--user", "--cgroup", "--netns"}
if unknown or not command or "--parent" not in options:
    fail(127, f"the exec wrapper cannot run {sys.argv[1:]!r}")
for folder in options.get("--cgroup", ()):
    try:
        fd = os.open(os.path.join(folder, "cgroup.procs"), os.O_WRONLY)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)
    except OSError as e:
        fail(126, f"cannot join the cgroup {folder}: {e.strerror}")
for fd in options.get("--netns", ()):
    if ctypes.CDLL(None, use_errno=True).setns(int(fd), 0x40000000) != 0:  # CLONE_NEWNET
        fail(126, f"cannot join the network namespace: {os.strerror(ctypes.get_errno())}")
    os.close(int(fd))
if "--user" in options:
    uid, gid = (int(x) for x in options["--user"][-1].split(":"))
    os.setgroups([gid])
    os.setgid(gid)
    os.setuid(uid)
    os.umask(0o007)
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
for s in ("SIGPIPE", "SIGXFSZ"):  # Python ignores them; an exec keeps what is ignored
    signal.signal(getattr(signal, s), signal.SIG_DFL)
if os.getppid() != int(options["--parent"][0]):
    os._exit(1)
try:
    os.execvp(command[0], command)
except OSError as e:
    fail(127, f"cannot run {command[0]}: {e.strerror}")
"""


def dying_with(
    command: Sequence[str],
    parent_pid: int,
    user: tuple[int, int] | None = None,
    *,
    cgroups: Sequence[Path] = (),
    netns: int | None = None,
) -> list[str]:
    """`command`, made to die with `parent_pid`'s launching thread on Linux, to run as
    `user` (uid, gid; the gid its only group, umask 007) when given, and inside each of
    `cgroups` (directories of a cgroup filesystem, joined as root before anything else:
    the launcher must be root to move a process there), and in the network namespace
    the descriptor `netns` names (the caller passes it on: Popen's `pass_fds`)."""
    if not sys.platform.startswith("linux"):
        if user is not None or cgroups or netns is not None:
            raise OSError("running a command as another user or in a cgroup needs Linux")
        return list(command)
    options = ["--parent", str(parent_pid)]
    if user is not None:
        options += ["--user", f"{user[0]}:{user[1]}"]
    for folder in cgroups:
        options += ["--cgroup", str(folder)]
    if netns is not None:
        options += ["--netns", str(netns)]
    wrapper = [sys.executable, "-I", "-S", "-c", _EXEC_WITH_PDEATHSIG]
    return [*wrapper, *options, "--", *command]


def torchrun_env(
    *,
    rank: int,
    world_size: int,
    local_rank: int,
    local_world_size: int,
    master_addr: str,
    master_port: int,
    run_id: str,
) -> dict[str, str]:
    """The variables torchrun gives each process, so that Lightning, Accelerate and
    `init_process_group("env://")` see a torchrun launch (`TORCHELASTIC_RUN_ID` included).
    The group (machine) rank is `rank // local_world_size`, as `assay.core` reads it back.
    """
    local = max(1, local_world_size)
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "GROUP_RANK": str(rank // local),
        "GROUP_WORLD_SIZE": str(max(1, world_size // local)),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world_size),
        "ROLE_NAME": "default",
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
    }
