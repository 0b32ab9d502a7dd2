"""The processes of one allocation: launched, their output pumped, stopped, reaped.

Each rank runs in its own process group (its DataLoader workers die with it) and asks
Linux to SIGTERM it when the agent's launching thread dies (PR_SET_PDEATHSIG). That
signal follows the *thread* that spawned it, so launch from a thread that lives as long
as the agent.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from assay.agent._isolation import Identity
from assay.common.spawn import dying_with
from assay.errors import PREEMPTED_EXIT_CODE

log = logging.getLogger("assay.agent")

POLL_INTERVAL = 0.05
MAX_LINE_BYTES = 64 * 1024
PUMP_JOIN_TIMEOUT = 2.0

LineSink = Callable[[int, str, str], None]  # (rank, "stdout" | "stderr", line)


def wrap_command(
    command: Sequence[str],
    agent_pid: int,
    identity: Identity | None = None,
    cgroups: Sequence[Path] = (),
    netns: int | None = None,
) -> list[str]:
    """`command`, made to die with the agent on Linux (PR_SET_PDEATHSIG), to run as
    `identity` when given, and inside the cgroup directories `cgroups` and the network
    namespace `netns` (a descriptor), joined before it starts (see `assay.common.spawn`)."""
    user = (identity.uid, identity.gid) if identity else None
    try:
        return dying_with(command, agent_pid, user, cgroups=cgroups, netns=netns)
    except OSError:
        raise OSError("isolating allocations needs Linux") from None


def describe_exit(code: int) -> str:
    """ "exited with code 3" or "was killed by SIGKILL" (Popen's negative codes)."""
    if code == PREEMPTED_EXIT_CODE:
        return "stopped at a checkpoint when asked to (it resumes later)"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


@dataclass(frozen=True)
class RankSpec:
    """One process to launch: its rank in the trial and its environment."""

    rank: int
    env: dict[str, str]


@dataclass(frozen=True)
class ExitReport:
    """Exit codes in launch order (negative: killed by that signal) and the first failure."""

    codes: list[int]
    failed: int | None  # index of the first process seen failing on its own, if any
    # Indexes of the processes that had exited 0 when that failure was seen.
    early: tuple[int, ...] = ()


class RankProcesses:
    """Launches one process per `RankSpec`; stops them all when one fails."""

    def __init__(
        self,
        command: Sequence[str],
        cwd: Path,
        specs: Sequence[RankSpec],
        sink: LineSink,
        identity: Identity | None = None,
        cgroups: Sequence[Path] = (),
        netns: int | None = None,
    ) -> None:
        """`identity`: the user the processes run as (None: the agent's own); `cgroups`:
        the directories of the cgroup they start in (none: the agent's); `netns`: a
        descriptor of the network namespace they run in (None: the agent's)."""
        self.command = list(command)
        self.identity = identity
        self.cgroups = tuple(cgroups)
        self.netns = netns
        self.cwd = cwd
        self.specs = list(specs)
        self._sink = sink
        self._procs: list[subprocess.Popen[bytes]] = []
        self._pumps: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._deadline: float | None = None
        self._grace: float | None = None  # the SIGTERM's grace, None once killed outright
        self._overdue_said = False
        # The last lines of each process, by stream, for the exit message.
        self._tails = [
            {"stdout": deque[str](maxlen=20), "stderr": deque[str](maxlen=20)} for _ in self.specs
        ]

    def spawn(self) -> None:
        """Start every process; if one cannot start, stop those already started."""
        command = wrap_command(self.command, os.getpid(), self.identity, self.cgroups, self.netns)
        try:
            for spec in self.specs:
                proc = subprocess.Popen(
                    command,
                    cwd=self.cwd,
                    env=spec.env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                    pass_fds=() if self.netns is None else (self.netns,),
                )
                self._procs.append(proc)
        except BaseException:
            self.kill()
            self.wait()
            raise
        # Readers start once every child exists: fewer threads running while we fork.
        for index, proc in enumerate(self._procs):
            for stream, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
                assert pipe is not None
                pump = threading.Thread(
                    target=self._pump,
                    args=(index, stream, pipe),
                    name=f"pump-{self.specs[index].rank}-{stream}",
                    daemon=True,
                )
                pump.start()
                self._pumps.append(pump)

    def last_line(self, index: int) -> str:
        """The last non-blank line the `index`-th process wrote, stderr first."""
        for stream in ("stderr", "stdout"):
            line = next((x for x in reversed(self._tails[index][stream]) if x.strip()), "")
            if line:
                return line
        return ""

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def _pump(self, index: int, stream: str, pipe: IO[bytes]) -> None:
        rank = self.specs[index].rank
        with pipe:
            for raw in iter(lambda: pipe.readline(MAX_LINE_BYTES), b""):
                line = raw.decode(errors="replace").rstrip("\r\n")
                self._tails[index][stream].append(line)
                self._sink(rank, stream, line)

    def _signal(self, sig: signal.Signals, *, group: bool = True) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    if group:
                        os.killpg(proc.pid, sig)
                    else:
                        os.kill(proc.pid, sig)

    def terminate(self, grace: float) -> None:
        """SIGTERM each slot's process; SIGKILL (from `wait`) its whole group after `grace`.

        Only the harness process gets the SIGTERM: it checkpoints and exits, and shuts its
        DataLoader workers down itself (a SIGTERM to them would break the batch it needs).
        """
        with self._lock:
            deadline = time.monotonic() + max(0.0, grace)
            if self._deadline is None or deadline < self._deadline:
                self._deadline = deadline
                self._grace = max(0.0, grace)
        self._signal(signal.SIGTERM, group=False)

    def kill(self) -> None:
        """SIGKILL every process group now."""
        with self._lock:
            self._deadline = time.monotonic()
            self._grace = None
        self._signal(signal.SIGKILL)

    def _say_overdue(self, codes: Sequence[int | None]) -> None:
        """Put in the trial's log, once, that a process outlived its SIGTERM's grace."""
        with self._lock:
            grace, said = self._grace, self._overdue_said
            self._overdue_said = True
        if said or grace is None:
            return
        ranks = ", ".join(str(s.rank) for s, c in zip(self.specs, codes, strict=True) if c is None)
        self._sink(
            self.specs[0].rank,
            "assay",
            f"assay: rank {ranks} still running {grace:g} s after SIGTERM: killed (SIGKILL); "
            "to stop at a checkpoint instead, a script checks core.preempt.should_preempt() "
            "and exits (the trial resumes from its latest checkpoint either way)",
        )

    def wait(
        self, failure_grace: float = 30.0, ended: Callable[[], None] | None = None
    ) -> ExitReport:
        """Block until every process has exited; the first failure terminates the rest.

        `ended` is called once they all have, before the rest of their output is read:
        it ends what they left running (which may hold their output open)."""
        failed: int | None = None
        early: tuple[int, ...] = ()
        while True:
            codes = [p.poll() for p in self._procs]
            if failed is None:
                failed = next((i for i, c in enumerate(codes) if c not in (None, 0)), None)
                if failed is not None:
                    early = tuple(i for i, c in enumerate(codes) if c == 0)
                if failed is not None and None in codes and self._deadline is None:
                    log.info(
                        "rank %d %s; stopping the other ranks",
                        self.specs[failed].rank,
                        describe_exit(codes[failed] or 0),
                    )
                    self.terminate(failure_grace)
            if all(c is not None for c in codes):
                break
            with self._lock:
                overdue = self._deadline is not None and time.monotonic() >= self._deadline
            if overdue:
                self._say_overdue(codes)
                self._signal(signal.SIGKILL)
            time.sleep(POLL_INTERVAL)
        for proc in self._procs:  # strays left in a group by a rank that exited
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        if ended is not None:
            ended()
        for pump in self._pumps:
            pump.join(PUMP_JOIN_TIMEOUT)
        return ExitReport([int(c) for c in codes if c is not None], failed, early)


__all__ = ["ExitReport", "RankProcesses", "RankSpec", "describe_exit", "wrap_command"]
