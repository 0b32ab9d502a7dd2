"""A child command that dies with its launcher, started without running fork handlers.

`preexec_fn` (or Popen's `user=`) forces a real fork() of the launcher. When the launcher
holds gRPC threads (an agent always does; a `run_local` caller with a client open may),
gRPC's fork handlers now and then abort that child ("epoll_wait error: Bad file
descriptor", SIGABRT) before it runs a line. Without them subprocess uses vfork and runs
no handlers, so the work is done by a small exec wrapper in the child instead: it becomes
the given user when there is one, asks Linux to SIGTERM it when the launching *thread*
dies (PR_SET_PDEATHSIG, which survives exec but is cleared by a user switch, so it comes
after), checks the launcher did not die first, then execs the command.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

_EXEC_WITH_PDEATHSIG = """
import ctypes, os, signal, sys
parent, uid, gid = int(sys.argv[1]), sys.argv[2], sys.argv[3]
if uid != "-":
    os.setgroups([int(gid)])
    os.setgid(int(gid))
    os.setuid(int(uid))
    os.umask(0o007)
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
for s in ("SIGPIPE", "SIGXFSZ"):  # Python ignores them; an exec keeps what is ignored
    signal.signal(getattr(signal, s), signal.SIG_DFL)
if os.getppid() != parent:
    os._exit(1)
try:
    os.execvp(sys.argv[4], sys.argv[4:])
except OSError as e:
    print(f"cannot run {sys.argv[4]}: {e.strerror}", file=sys.stderr)
    os._exit(127)
"""


def dying_with(
    command: Sequence[str], parent_pid: int, user: tuple[int, int] | None = None
) -> list[str]:
    """`command`, made to die with `parent_pid`'s launching thread on Linux, and to run
    as `user` (uid, gid; the gid its only group, umask 007) when given."""
    if not sys.platform.startswith("linux"):
        if user is not None:
            raise OSError("running a command as another user needs Linux")
        return list(command)
    uid, gid = (str(user[0]), str(user[1])) if user else ("-", "-")
    wrapper = [sys.executable, "-I", "-S", "-c", _EXEC_WITH_PDEATHSIG]
    return [*wrapper, str(parent_pid), uid, gid, *command]
