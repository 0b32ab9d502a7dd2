"""What `assay deploy local up` says while it waits, on stderr: the master starting (its
store migrated first when the schema is older than this release), then each agent
finding its slots and joining. Read from the logs of the processes `up` started, which
it names; the slots each agent chose are returned for `up` to print."""

from __future__ import annotations

import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import click

# Lines of assay-master's and assay-agent's logs (their tests pin the wording).
MIGRATED = re.compile(r"store schema upgraded to revision (\S+)")
SLOTS = re.compile(r"agent (\S+): (\d+) (cpu|cuda) slot\(s\) \((.*)\), address ")
NO_GPU = re.compile(r"no GPU found \((.*)\); offering CPU slots")
JOINED = re.compile(r"registered with master at ")
FAILED = re.compile(r"^assay-agent: error: (.*)$")
POLL_S = 0.2


def progress(message: str) -> None:
    """One line of what `up` is doing now, on stderr (stdout keeps the results)."""
    click.echo(message, err=True)


class LogTail:
    """The whole lines appended to a log file after `offset`, as they come."""

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path = path
        self.offset = offset
        self._partial = b""

    def lines(self) -> list[str]:
        try:
            with self.path.open("rb") as log:
                log.seek(self.offset)
                data = log.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        *whole, self._partial = (self._partial + data).split(b"\n")
        return [line.decode(errors="replace") for line in whole]


@dataclass
class AgentSlots:
    """What an agent said it offers: `count` slots of `kind` (cpu or cuda), the first
    one's device name, and why it found no GPU (when it looked and found none)."""

    name: str
    count: int = 0
    kind: str = ""
    device: str = ""
    no_gpu: str | None = None

    def read(self, line: str) -> None:
        found = SLOTS.search(line)
        if found:
            self.count, self.kind, self.device = int(found[2]), found[3], found[4]
        no_gpu = NO_GPU.search(line)
        if no_gpu:
            self.no_gpu = no_gpu[1]

    def line(self, slot_type: str) -> str:
        """`agent local-0: 2 GPU slots (NVIDIA H100), by --slot-type auto (...)`."""
        kind = "GPU" if self.kind == "cuda" else "CPU"
        plural = "s" if self.count != 1 else ""
        offers = f"agent {self.name}: {self.count} {kind} slot{plural} ({self.device})"
        if slot_type != "auto":
            return f"{offers}, as --slot-type {slot_type} asks"
        if self.kind == "cuda":
            why = "NVML found GPUs; --slot-type cpu offers the CPUs instead"
        else:
            found = f": {self.no_gpu}" if self.no_gpu else ""
            why = f"no GPU found{found}"
        return f"{offers}, by --slot-type auto ({why})"


def running(pid: int) -> bool:
    """Whether process `pid` (a child of this one, or not) still runs: an exited child
    is reaped here, so that it does not linger as a zombie that seems alive."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return False
    except ChildProcessError:
        pass  # not this process's child
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def port_taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_for_master(port: int, pid: int, log: LogTail, timeout: float) -> bool:
    """Until the master answers on `port` (True), or exits or `timeout` passes (False),
    saying when it migrates its store and how long it took."""
    start = time.monotonic()
    migrations: list[str] = []
    while time.monotonic() - start < timeout:
        for line in log.lines():
            found = MIGRATED.search(line)
            if found:
                if not migrations:
                    progress("migrating the store to this release's schema ...")
                migrations.append(found[1])
        if port_taken(port):
            said = f"master up after {time.monotonic() - start:.1f} s"
            if migrations:
                count = len(migrations)
                said += (
                    f" ({count} schema migration{'s' if count != 1 else ''} run, "
                    f"now at revision {migrations[-1]})"
                )
            progress(said)
            return True
        if not running(pid):
            return False
        time.sleep(POLL_S)
    return False


class AgentDidNotJoin(Exception):  # noqa: N818 - it says what happened, as errors here do
    """An agent `up` started exited, or did not join in time: `name`, and why."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"agent {name} {why}")
        self.name = name


def wait_for_agents(agents: dict[str, tuple[int, LogTail]], timeout: float) -> list[AgentSlots]:
    """Until every agent (name: its pid and log) has joined the master, saying each as it
    does; their slots, in the order given. `AgentDidNotJoin` names one that exited (with
    the error it gave) or that had not joined after `timeout` seconds."""
    if not agents:
        return []
    names = ", ".join(agents)
    plural = "s" if len(agents) > 1 else ""
    progress(f"waiting for agent{plural} {names} to find slots and join the master")
    start = time.monotonic()
    slots = {name: AgentSlots(name) for name in agents}
    pending = dict(agents)
    last: dict[str, str] = {}
    while pending:
        for name, (pid, log) in list(pending.items()):
            joined = False
            for line in log.lines():
                slots[name].read(line)
                joined = joined or JOINED.search(line) is not None
                if line.strip():
                    last[name] = line.strip()
            if joined:
                progress(f"agent {name} joined after {time.monotonic() - start:.1f} s")
                del pending[name]
            elif not running(pid):
                said = last.get(name, "no output")
                failed = FAILED.match(said)
                raise AgentDidNotJoin(
                    name, f"exited: {failed[1] if failed else said} (its log: {log.path})"
                )
        if pending and time.monotonic() - start > timeout:
            name, (_, log) = next(iter(pending.items()))
            raise AgentDidNotJoin(
                name, f"did not join the master within {timeout:.0f} s (its log: {log.path})"
            )
        if pending:
            time.sleep(POLL_S)
    return [slots[name] for name in agents]


__all__ = [
    "AgentDidNotJoin",
    "AgentSlots",
    "LogTail",
    "port_taken",
    "progress",
    "running",
    "wait_for_agents",
    "wait_for_master",
]
