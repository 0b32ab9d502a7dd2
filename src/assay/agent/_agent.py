"""The agent: its slots, its stream to the master, and the allocations it runs.

`Agent.run()` owns the launching thread: every harness process is forked from it, and
PR_SET_PDEATHSIG ties the processes to that thread, so run it on a thread that lives as
long as the agent (the main thread, in `assay-agent`). Master messages arrive on the
connection's thread and are queued for it; allocations report their exit from their
own watcher threads.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
from google.protobuf.timestamp_pb2 import Timestamp

import assay
from assay.agent._allocation import (
    Allocation,
    AllocationError,
    shareable_environment,
    state_change,
    validate,
)
from assay.agent._cgroups import Allowance, CgroupError, Cgroups
from assay.agent._config import AgentSettings, memory_bytes
from assay.agent._connection import Backoff, MasterConnection
from assay.agent._credential import CredentialFile
from assay.agent._devices import DeviceMonitor, detect_devices, slot_type_proto
from assay.agent._isolation import Isolation
from assay.agent._netns import LoopbackNetwork, split_address
from assay.agent._process import wrap_command
from assay.agent._usage import RankProcess, RankSampler
from assay.config import format_size
from assay.errors import PREEMPTED_EXIT_CODE
from assay.proto import agent_pb2

log = logging.getLogger("assay.agent")

HARNESS_COMMAND = (sys.executable, "-m", "assay._cluster")


def guess_address(master: str) -> str:
    """This machine's address on the route to the master (no packet is sent)."""
    host = split_address(master)[0]
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return str(s.getsockname()[0])
    except OSError:
        return socket.gethostname()


def closed_folder(path: Path) -> Path | None:
    """The highest folder above `path` (or `path` itself) that users other than its owner
    and group cannot pass through (no `o+x`), if any."""
    for folder in [*reversed(path.parents), path]:
        with contextlib.suppress(OSError):
            if not folder.stat().st_mode & 0o001:
                return folder
    return None


def default_work_dir(agent_id: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", agent_id)
    return Path(tempfile.gettempdir()) / f"assay-agent-{safe}"


class Agent:
    """One agent daemon. Raises `NoGPUError` at construction for cuda without GPUs."""

    def __init__(
        self,
        settings: AgentSettings,
        *,
        harness_command: Sequence[str] = HARNESS_COMMAND,
        version: str = assay.__version__,
        nvml: Any | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        """`harness_command` is what each rank runs and `version` what the agent reports
        to the master (assay-agent's hidden --harness-command and --reported-version, for
        debugging and tests); `nvml` and `backoff` replace NVML and the reconnect delays
        in tests."""
        if not harness_command:
            raise ValueError("harness_command must not be empty")
        self.settings = settings
        self.harness_command = tuple(harness_command)
        self.version = version
        self.devices: DeviceMonitor = detect_devices(settings.slot_type, settings.slots, nvml)
        # What the settings leave to the agent, decided once, at start.
        self.address = settings.address or guess_address(settings.master)
        self.work_dir = (settings.work_dir or default_work_dir(settings.agent_id)).resolve()
        self.tls = settings.client_tls  # trial processes reach the master as the agent does
        mode = settings.isolation
        if mode == "auto":
            mode = "uid" if os.geteuid() == 0 else "none"
        self.isolation = Isolation(mode, settings.isolation_uid_base, settings.isolation_uids)
        self.cgroups = self._open_cgroups()
        self._check_network()
        total = psutil.virtual_memory().total
        self.allowance = Allowance(
            memory=memory_bytes(settings.allocation_memory, total),
            pids_per_slot=settings.pids_per_slot,
        )
        self._check_work_dir()
        self._check_trials_can_start()
        self._events: queue.Queue[agent_pb2.MasterMessage] = queue.Queue()
        self.connection = MasterConnection(
            settings.master,
            register=self._register,
            heartbeat=self._heartbeat,
            on_message=self._enqueue,
            timeout=settings.heartbeat_timeout,
            backoff=backoff,
            on_refused=lambda reason: self.stop(),
            join_token=settings.join_token,
            tls=self.tls,
            credential=CredentialFile(settings.credential_file or self.work_dir / "credential"),
        )
        self._lock = threading.Lock()
        self._allocations: dict[str, Allocation] = {}
        self._rank_sampler = RankSampler()  # each rank's use, for the heartbeat
        self._stop_requests = 0  # a plain int: signal handlers only bump it
        self._stopping = False  # shutting down: it starts nothing, and every heartbeat says so

    @property
    def running_allocations(self) -> list[str]:
        with self._lock:
            return sorted(self._allocations)

    def stop(self) -> None:
        """Ask `run()` to stop the allocations (SIGTERM, then SIGKILL after the grace) and
        return; a second call SIGKILLs them at once. Safe to call from a signal handler."""
        self._stop_requests += 1

    def _open_cgroups(self) -> Cgroups | None:
        """The cgroups of this agent's allocations, per the `cgroups` setting (None: off).
        Raises ValueError saying what to do where they are needed and cannot be made."""
        choice = self.settings.cgroups
        if choice == "off" or (choice == "auto" and not self.isolation.enabled):
            return None
        try:
            return Cgroups.open(self.settings.agent_id)
        except (CgroupError, OSError) as e:
            why = "isolation: uid puts" if choice == "auto" else "cgroups: on puts"
            raise ValueError(
                f"{why} each allocation in a cgroup of its own, and the agent cannot make one: {e}"
            ) from None

    def _check_network(self) -> None:
        """`isolation_network: loopback` needs isolated trials (a uid of their own keeps
        them from leaving the namespace) and a kernel that makes network namespaces: made
        once here, so that an agent that cannot refuses to start instead of each trial.
        Raises ValueError with what to do."""
        if self.settings.isolation_network != "loopback":
            return
        if not self.isolation.enabled:
            raise ValueError(
                "isolation_network: loopback runs each isolated trial in a network of its "
                "own, and this agent does not isolate trials (isolation: none): run it as "
                "root with isolation: uid, or set isolation_network: host"
            )
        try:
            LoopbackNetwork(("127.0.0.1", 9), name="startup-check").close()
        except OSError as e:
            raise ValueError(f"{e}, or set isolation_network: host") from None

    def _check_work_dir(self) -> None:
        """Isolated, a trial runs as a uid of no account and reads its trial.json in its
        allocation's directory under the work dir: that uid must pass through every folder
        above it. A work dir under one only its owner may enter (`mktemp -d`, many a home
        directory: 0700) would fail every trial placed here, so the agent makes the work
        dir as `run()` opens it and enters it as such a uid before joining. Raises
        ValueError with what to do."""
        if not self.isolation.enabled:
            return
        allocations = self.work_dir / "allocations"
        try:
            allocations.mkdir(parents=True, exist_ok=True)
            # Allocations reach their own directory (0700 each) but cannot list others.
            for folder in (self.work_dir, allocations):
                folder.chmod(0o711)
        except OSError as e:
            raise ValueError(f"cannot make the work dir {self.work_dir}: {e}") from None
        code, said = self._run_as_lent_uid(["/bin/sh", "-c", 'cd "$1"', "sh", str(allocations)])
        if code == 0:
            return
        closed = closed_folder(allocations)
        where = (
            f"{closed} (mode {closed.stat().st_mode & 0o7777:04o}) lets no other user through"
            if closed is not None
            else said
        )
        let_through = f"`chmod o+x {closed}`, " if closed is not None else ""
        raise ValueError(
            f"trials run as a uid of their own (isolation: uid), and such a uid cannot reach "
            f"the work dir {self.work_dir}: {where}, so every trial would fail to read its "
            f"trial.json. Give the agent a work_dir that every user can pass through (e.g. "
            f"/var/lib/assay/agent, as deploy/install-agent.sh does), let them through with "
            f"{let_through}or set isolation: none on a machine only you use"
        )

    def _check_trials_can_start(self) -> None:
        """Isolated, a trial runs as a uid of no account: check that such a uid can start
        the harness (its Python and Assay readable by every user) before joining, rather
        than failing each trial placed here. Raises ValueError with what to do."""
        command = self.harness_command
        if not self.isolation.enabled or tuple(command[1:3]) != ("-m", "assay._cluster"):
            return
        code, said = self._run_as_lent_uid([command[0], "-c", "import assay._cluster"])
        if code == 0:
            return
        raise ValueError(
            f"trials run as a uid of their own (isolation: uid), and such a uid cannot run "
            f"{command[0]} -m assay._cluster ({said}): install Assay where every user can "
            "read and run it (e.g. a virtualenv under /opt, as deploy/install-agent.sh "
            "does), or set isolation: none on a machine only you use"
        )

    def _run_as_lent_uid(self, probe: list[str]) -> tuple[int, str]:
        """Run `probe` from / as a uid lent as to a trial, with a trial's environment;
        its exit code and the last line it wrote to stderr (else what ended it)."""
        identity = self.isolation.lend("startup-check", 0)
        try:
            done = subprocess.run(
                wrap_command(probe, os.getpid(), identity),
                cwd="/",
                env=self.isolation.environment_for(shareable_environment(), Path("/nonexistent")),
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            code, err = done.returncode, done.stderr
        except subprocess.TimeoutExpired:
            code, err = -1, "it did not start within 120 s"
        finally:
            self.isolation.give_back(identity)
        return code, (err.strip().splitlines() or [f"exit code {code}"])[-1]

    def run(self) -> None:
        """Serve the master until `stop()`; every allocation has exited when it returns."""
        self._clean_work_dir()
        if self.cgroups is not None:
            self.cgroups.clean()  # what an earlier run of this agent left running
        thread = threading.Thread(target=self.connection.run, name="master", daemon=True)
        thread.start()
        log.info(
            "agent %s: %d %s slot(s) (%s), address %s, work dir %s, master %s",
            self.settings.agent_id,
            len(self.devices.devices),
            self.devices.kind,
            self.devices.devices[0].name,
            self.address,
            self.work_dir,
            self.settings.master,
        )
        if self.cgroups is not None:
            log.info(
                "each allocation runs in a cgroup of its own (%s): at most %s of memory "
                "and %s processes and threads per slot",
                self.cgroups.description,
                format_size(self.allowance.memory),
                self.allowance.pids_per_slot or "any number of",
            )
        elif self.isolation.enabled:
            log.warning(
                "cgroups: off -- allocations have no memory or process limits, and what "
                "one leaves running is killed by its uid alone"
            )
        if self.isolation.enabled:
            log.info("each allocation runs as a uid of its own (isolation: uid)")
        else:
            log.warning(
                "isolation: none -- single-tenant: every trial runs as this agent's user "
                "and can read its files and environment and other trials' processes and "
                "files; run the agent as root for a uid per allocation"
            )
        if self.settings.isolation_network == "loopback":
            log.info(
                "each allocation runs in a network of its own: its loopback, the master's "
                "trial API and its checkpoint storage (isolation_network: loopback)"
            )
        forced = False
        try:
            while True:
                if self._stop_requests and not self._stopping:
                    self._stopping = True
                    # First, so that the master places nothing here that would be
                    # refused; the stopped trials then go to other agents.
                    self.connection.send(agent_pb2.AgentMessage(heartbeat=self._heartbeat()))
                    self._stop_all(graceful=True)
                if self._stop_requests > 1 and not forced:
                    forced = True
                    self._stop_all(graceful=False)
                if self._stopping and not self.running_allocations:
                    break
                with contextlib.suppress(queue.Empty):
                    self._handle(self._events.get(timeout=0.1))
        finally:
            self.connection.close()
            thread.join(timeout=5)
            self.devices.close()
            if self.cgroups is not None:
                self.cgroups.close()
            log.info("agent %s stopped", self.settings.agent_id)

    def _enqueue(self, message: agent_pb2.MasterMessage) -> None:
        self._events.put(message)

    def _handle(self, message: agent_pb2.MasterMessage) -> None:
        if message.HasField("start"):
            self._start(message.start)
        elif message.HasField("kill"):
            self._kill(message.kill)

    def _start(self, start: agent_pb2.StartAllocation) -> None:
        allocation_id = start.allocation_id
        stopping = self._stopping
        with self._lock:
            known = allocation_id in self._allocations
            busy = {s for a in self._allocations.values() for s in a.slots}
        if known:  # the master re-sent it (e.g. after its restart): it is running
            self.connection.send(state_change(allocation_id, agent_pb2.ALLOCATION_STATE_RUNNING))
            return
        log.info(
            "starting allocation %s (trial %d, slots %s)",
            allocation_id,
            start.trial_id,
            list(start.slots),
        )
        if not stopping:  # a stopping agent refuses at once (below), without waiting
            busy = self._wait_for_slots(set(start.slots), busy)
        allocation = Allocation(
            start,
            self.connection.send,
            self._done,
            work_dir=self.work_dir,
            harness_command=self.harness_command,
            slot_kind=self.devices.kind,
            address=self.address,
            tls=self.tls,
            grace=self.settings.grace,
            keep_dir=self.settings.keep_work_dirs,
            isolation=self.isolation,
            cgroups=self.cgroups,
            allowance=self.allowance,
            network=self.settings.isolation_network,
        )
        try:
            if stopping:
                raise AllocationError("the agent is shutting down")
            validate(start, len(self.devices.devices), busy)
            with self._lock:
                self._allocations[allocation_id] = allocation
            allocation.launch()
        except AllocationError as e:
            with self._lock:
                self._allocations.pop(allocation_id, None)
            log.warning("cannot start allocation %s: %s", allocation_id, e)
            # A start refused because the agent is shutting down (the master placed it
            # before it heard so) is stopped by the agent, as its running trials are:
            # requeued, not a failure of the trial.
            codes = (PREEMPTED_EXIT_CODE,) if stopping else e.codes
            self.connection.send(
                state_change(allocation_id, agent_pb2.ALLOCATION_STATE_EXITED, codes, str(e))
            )

    def _wait_for_slots(self, wanted: set[int], busy: set[int]) -> set[int]:
        """Give slots that are still being freed a moment before refusing a start.

        The master frees a slot when it sends a kill and may place the next run there at
        once (after its own restart, or when a gang loses an agent); the killed processes
        need up to the grace period to go.
        """
        deadline = time.monotonic() + self.settings.grace + 5.0
        while wanted & busy and time.monotonic() < deadline:
            time.sleep(0.05)
            with self._lock:
                busy = {s for a in self._allocations.values() for s in a.slots}
        return busy

    def _kill(self, kill: agent_pb2.KillAllocation) -> None:
        with self._lock:
            allocation = self._allocations.get(kill.allocation_id)
        if allocation is None:
            self.connection.send(
                state_change(
                    kill.allocation_id,
                    agent_pb2.ALLOCATION_STATE_EXITED,
                    (),
                    "not running on this agent",
                )
            )
            return
        grace = float(kill.grace_seconds) if kill.grace_seconds > 0 else self.settings.grace
        how = f"SIGTERM, then SIGKILL after {grace:g}s" if kill.graceful else "SIGKILL"
        log.info("killing allocation %s (%s)", kill.allocation_id, how)
        allocation.kill(kill.graceful, grace, f"killed by the master ({how})")

    def _stop_all(self, graceful: bool) -> None:
        with self._lock:
            allocations = list(self._allocations.values())
        how = f"SIGTERM, then SIGKILL after {self.settings.grace:g}s" if graceful else "SIGKILL"
        if allocations:
            log.info("stopping %d allocation(s) (%s)", len(allocations), how)
        for allocation in allocations:
            allocation.kill(
                graceful, self.settings.grace, f"the agent is shutting down ({how})", by_agent=True
            )

    def _done(self, allocation_id: str) -> None:
        with self._lock:
            self._allocations.pop(allocation_id, None)

    def _register(self) -> agent_pb2.Register:
        return agent_pb2.Register(
            agent_id=self.settings.agent_id,
            version=self.version,
            slot_type=slot_type_proto(self.devices.kind),
            devices=[d.to_proto() for d in self.devices.sample()],
            address=self.address,
            # An allocation whose exit is still queued counts as running: the master keeps
            # it, then hears how it ended from the queued message right after.
            running_allocations=sorted(
                set(self.running_allocations) | self.connection.outbox.unreported_exits()
            ),
            memory_bytes=psutil.virtual_memory().total,
            resource_pool=self.settings.resource_pool,
            agent_label=self.settings.agent_label or "",
        )

    def _heartbeat(self) -> agent_pb2.Heartbeat:
        now = Timestamp()
        now.GetCurrentTime()
        busy = psutil.cpu_percent(interval=None) / 100.0
        devices = self.devices.sample(cpu_busy=busy)
        return agent_pb2.Heartbeat(
            time=now,
            devices=[d.to_proto() for d in devices],
            cpu_utilization=busy,
            memory_used_fraction=psutil.virtual_memory().percent / 100.0,
            ranks=self._rank_sampler.sample(self._rank_processes(), devices),
            stopping=self._stopping,
        )

    def _rank_processes(self) -> list[RankProcess]:
        """The process of every rank this agent runs now."""
        with self._lock:
            allocations = list(self._allocations.values())
        out = []
        for allocation in allocations:
            processes = allocation.processes
            if processes is None:
                continue
            start = allocation.start_msg
            for slot, rank, pid in zip(start.slots, start.ranks, processes.pids, strict=False):
                out.append(RankProcess(allocation.id, rank, slot, pid))
        return out

    def _clean_work_dir(self) -> None:
        """Remove allocation directories left by an earlier run (their processes died
        with it), unless they are kept for debugging."""
        leftovers = self.work_dir / "allocations"
        if leftovers.exists() and not self.settings.keep_work_dirs:
            shutil.rmtree(leftovers, ignore_errors=True)
        leftovers.mkdir(parents=True, exist_ok=True)
        if self.isolation.enabled:
            # As _check_work_dir opened them (recreated here after the cleanup).
            self.work_dir.chmod(0o711)
            leftovers.chmod(0o711)


__all__ = ["HARNESS_COMMAND", "Agent", "default_work_dir", "guess_address"]
