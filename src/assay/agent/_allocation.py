"""One allocation on this agent: its directory, trial spec, processes, logs and exit.

Layout: `<work-dir>/allocations/<allocation_id>/` holds `model/` (the extracted model
definition, the processes' working directory) and `trial.json` (the harness's
`ClusterSpec`, named by `ASSAY_TRIAL_SPEC`). It is deleted once the processes have
exited, unless the agent keeps work directories for debugging. Isolated, the
experiment's shared_fs directory (the start's `checkpoint_root`) is made the experiment
group's before the processes start (`Isolation.give_experiment_directory`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import re
import shutil
import socket
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from assay.agent._cgroups import Allowance, Cgroup, Cgroups
from assay.agent._devices import SlotKind
from assay.agent._isolation import Identity, Isolation, kill_processes_of
from assay.agent._logs import LogBatcher
from assay.agent._nccl import interface_of, nccl_environment
from assay.agent._netns import LoopbackNetwork, outlets_of, split_address
from assay.agent._process import ExitReport, RankProcesses, RankSpec, describe_exit
from assay.common.archive import ModelDefinitionError, unpack_model_dir
from assay.common.spawn import torchrun_env
from assay.common.spec import ClusterSpec
from assay.common.tls import ClientTls
from assay.config import environment_of, format_size, parse_memory
from assay.errors import (
    PERMANENT_ERROR_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
    AssayError,
    InvalidConfigError,
    collective_mismatch_hint,
    early_exit_hint,
)
from assay.proto import agent_pb2

# Variables of the agent's environment that its trial processes never see: these, and
# any ASSAY_ variable whose name says it holds a secret (a master's settings in a shared
# environment, e.g. ASSAY_METRICS_TOKEN).
AGENT_SECRETS = frozenset(
    {
        "ASSAY_JOIN_TOKEN",
        "ASSAY_PASSWORD",
        "ASSAY_INITIAL_ADMIN_PASSWORD",
        "ASSAY_DB_URL",
        "ASSAY_TLS_KEY",
    }
)
_SECRET_WORDS = ("TOKEN", "PASSWORD", "SECRET", "KEY", "CREDENTIAL", "DB_URL")


def is_agent_secret(name: str) -> bool:
    """Whether the agent's variable `name` is kept from its trials."""
    if name in AGENT_SECRETS:
        return True
    return name.startswith("ASSAY_") and any(word in name for word in _SECRET_WORDS)


def shareable_environment() -> dict[str, str]:
    """The agent's environment without its secrets: what a trial's starts from."""
    return {k: v for k, v in os.environ.items() if not is_agent_secret(k)}


log = logging.getLogger("assay.agent")

_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")

Send = Callable[[agent_pb2.AgentMessage], None]


class AllocationError(AssayError):
    """A StartAllocation this agent cannot carry out; the message goes to the master,
    with `codes` as the exit codes (78 for a refusal every run would meet again)."""

    def __init__(self, message: str, codes: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.codes = tuple(codes)


def state_change(
    allocation_id: str,
    state: agent_pb2.AllocationState.ValueType,
    codes: Sequence[int] = (),
    message: str = "",
    failure: str = "",
) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(
        allocation_state=agent_pb2.AllocationStateChange(
            allocation_id=allocation_id,
            state=state,
            exit_codes=list(codes),
            message=message,
            failure=failure,
        )
    )


def _json_or_empty(text: str, field: str) -> Any:
    try:
        return json.loads(text) if text else {}
    except json.JSONDecodeError as e:
        raise AllocationError(f"{field} is not valid JSON: {e}") from None


def _config_environment(config: Any, slot_kind: str) -> dict[str, str]:
    """`environment.environment_variables` of the experiment config, for this slot kind."""
    try:
        return environment_of(config, slot_kind)
    except InvalidConfigError as e:
        raise AllocationError(f"refused the config's environment variables: {e}") from None


def _stores_on_shared_fs(config: Any) -> bool:
    """Whether the experiment's checkpoints go to shared_fs (its default) storage."""
    storage = config.get("checkpoint_storage") if isinstance(config, dict) else None
    return not isinstance(storage, dict) or storage.get("type", "shared_fs") == "shared_fs"


def _memory_per_slot(config: Any) -> int | None:
    """`resources.memory` of the experiment config, in bytes (None when unset)."""
    resources = config.get("resources") if isinstance(config, dict) else None
    value = resources.get("memory") if isinstance(resources, dict) else None
    if value is None:
        return None
    try:
        return parse_memory(value)
    except ValueError as e:
        raise AllocationError(f"refused the config's resources.memory: {e}") from None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def trial_spec(start: agent_pb2.StartAllocation) -> ClusterSpec:
    """The spec the harness reads from ASSAY_TRIAL_SPEC, built from the master's start."""
    return ClusterSpec(
        config=_json_or_empty(start.config_json, "config_json"),
        hparams=_json_or_empty(start.hparams_json, "hparams_json"),
        trial_seed=start.trial_seed,
        trial_id=start.trial_id,
        run_id=start.run_id,
        experiment_id=start.experiment_id,
        allocation_id=start.allocation_id,
        checkpoint_root=start.checkpoint_root,
        restore_from=start.checkpoint_location or None,
        trial_api=start.trial_api,
        token=start.token,
        restore_sha256=dict(start.checkpoint_sha256) or None,
    )


def validate(start: agent_pb2.StartAllocation, slot_count: int, busy: set[int]) -> None:
    """Refuse a StartAllocation this agent cannot honour, with a message saying why."""
    if not _SAFE_ID.match(start.allocation_id):
        raise AllocationError(f"allocation id {start.allocation_id!r} is not a safe name")
    slots, ranks = list(start.slots), list(start.ranks)
    if not slots or len(slots) != len(ranks):
        raise AllocationError(f"{len(slots)} slots but {len(ranks)} ranks; need one rank a slot")
    if len(set(slots)) != len(slots):
        raise AllocationError(f"slots {slots} name a slot twice")
    bad = [s for s in slots if not 0 <= s < slot_count]
    if bad:
        raise AllocationError(f"slots {bad} do not exist on this agent (it has {slot_count})")
    taken = sorted(busy.intersection(slots))
    if taken:
        raise AllocationError(f"slots {taken} are already running another allocation")
    if start.world_size < len(ranks) or any(not 0 <= r < start.world_size for r in ranks):
        raise AllocationError(f"ranks {ranks} do not fit world size {start.world_size}")


class Allocation:
    """Started from the agent's launching thread; a watcher thread reports its exit."""

    def __init__(
        self,
        start: agent_pb2.StartAllocation,
        send: Send,
        on_done: Callable[[str], None],
        *,
        work_dir: Path,
        harness_command: Sequence[str],
        slot_kind: SlotKind,
        address: str,
        tls: ClientTls,
        grace: float,
        keep_dir: bool = False,
        isolation: Isolation | None = None,
        cgroups: Cgroups | None = None,
        allowance: Allowance | None = None,
        network: str = "host",
    ) -> None:
        """`work_dir`: the agent's (this allocation's directory goes under it);
        `harness_command`: what each rank runs; `address`: MASTER_ADDR when the master
        leaves it empty; `tls`: how the processes reach the master (as the agent does);
        `grace`: SIGTERM-to-SIGKILL for the other ranks when one fails; `keep_dir`: keep
        the directory after the exit (debugging); `isolation`: lends the processes a
        uid of their own (none: they run as the agent); `cgroups`: gives them a cgroup
        of their own, limited as `allowance` says (none: they run in the agent's);
        `network`: "loopback" runs them in a network namespace of their own (see
        `_netns`), "host" in the agent's."""
        self.start_msg = start
        self.id = start.allocation_id
        self.slots = list(start.slots)
        self.dir = work_dir / "allocations" / self.id
        self.harness_command = tuple(harness_command)
        self.slot_kind = slot_kind
        self.address = address
        self.interface = interface_of(address)
        self.tls = tls
        self.grace = grace
        self.keep_dir = keep_dir
        self.isolation = isolation or Isolation("none", 0, 1)
        self.identity: Identity | None = None
        self.cgroups = cgroups
        self.allowance = allowance or Allowance(memory=2**62)
        self.cgroup: Cgroup | None = None
        self.network_mode = network
        self.network: LoopbackNetwork | None = None
        self._asked_memory: int | None = None  # resources.memory times its slots, if set
        self._oom_kills = 0
        self._send = send
        self._on_done = on_done
        self._kill_reason: str | None = None
        self._by_agent = False
        self._logs = LogBatcher(
            self.id,
            lambda batch: send(agent_pb2.AgentMessage(logs=batch)),
            trial_id=start.trial_id,
            run_id=start.run_id,
        )
        self.processes: RankProcesses | None = None

    @functools.cached_property
    def config(self) -> Any:
        """The experiment config of the start, read once (AllocationError if no JSON)."""
        return _json_or_empty(self.start_msg.config_json, "config_json")

    def launch(self) -> None:
        """Prepare the directory and spawn the ranks; raises AllocationError (cleaned up)."""
        try:
            processes = self._prepare()
            processes.spawn()
        except (AllocationError, OSError, RuntimeError) as e:
            self._end_processes(persist=False)  # on the launching thread: bounded
            self._close_network()
            self._remove_dir()
            self._remove_cgroup()
            self.isolation.give_back(self.identity)
            if isinstance(e, AllocationError):
                raise
            raise AllocationError(f"cannot start the harness: {e}") from None
        self.processes = processes
        log.info(
            "allocation %s: ranks %s started as pids %s",
            self.id,
            list(self.start_msg.ranks),
            processes.pids,
        )
        self._logs.start()
        self._send(state_change(self.id, agent_pb2.ALLOCATION_STATE_RUNNING))
        threading.Thread(target=self._watch, name=f"watch-{self.id}", daemon=True).start()

    def kill(self, graceful: bool, grace: float, reason: str, *, by_agent: bool = False) -> None:
        """SIGTERM now and SIGKILL after `grace` seconds; or SIGKILL now if not graceful.

        `by_agent`: the agent stops it on its own (shutting down), unknown to the master: a
        process that then exits 0 is reported as stopped at a checkpoint (80), so the trial
        is requeued, not ended (a script exits 0 when `should_preempt()` says so).
        """
        if self.processes is None:
            return
        self._by_agent = self._by_agent or by_agent
        if self._kill_reason is None:
            self._kill_reason = reason
        if graceful:
            self.processes.terminate(grace)
        else:
            self.processes.kill()

    def _prepare(self) -> RankProcesses:
        start = self.start_msg
        if self.dir.exists():
            shutil.rmtree(self.dir)  # left by an earlier run of this agent
        model_dir = self.dir / "model"
        self.dir.mkdir(parents=True, mode=0o700)
        try:
            if start.model_definition:
                unpack_model_dir(start.model_definition, model_dir)
            else:
                model_dir.mkdir()
        except ModelDefinitionError as e:
            raise AllocationError(f"refused the model definition: {e}") from None
        spec_path = self.dir / "trial.json"
        spec = trial_spec(start)
        self.network = self._make_network()
        if self.network is not None:  # its ranks reach the master through the relay
            spec = dataclasses.replace(spec, trial_api=self.network.trial_api)
        spec.write(spec_path)  # readable by its owner only
        self.identity = self.isolation.lend(self.id, start.experiment_id)
        self.isolation.hand_over(self.dir, self.identity)
        self.cgroup = self._make_cgroup()
        if start.checkpoint_root and _stores_on_shared_fs(self.config):
            try:
                self.isolation.give_experiment_directory(
                    Path(start.checkpoint_root), start.experiment_id
                )
            except OSError as e:
                raise AllocationError(
                    f"cannot prepare experiment {start.experiment_id}'s checkpoint directory "
                    f"{start.checkpoint_root}: {e}"
                ) from None
        port = start.master_port
        if port == 0 and len(start.slots) == start.world_size:
            port = _free_port()  # every rank is here: any free port will do
        specs = [
            RankSpec(rank, self._env(k, slot, rank, port, spec_path))
            for k, (slot, rank) in enumerate(zip(start.slots, start.ranks, strict=True))
        ]
        return RankProcesses(
            self.harness_command,
            model_dir,
            specs,
            self._logs.add,
            self.identity,
            self.cgroup.dirs if self.cgroup is not None else (),
            self.network.fd if self.network is not None else None,
        )

    def _make_network(self) -> LoopbackNetwork | None:
        """The allocation's own network namespace, with `isolation_network: loopback`."""
        if self.network_mode != "loopback":
            return None
        start = self.start_msg
        if len(start.slots) != start.world_size:
            raise AllocationError(
                f"this trial's {start.world_size} ranks span several agents, and this agent "
                "runs each trial in a network of its own (isolation_network: loopback), which "
                "ranks on other machines cannot reach: ask for at most "
                f"{len(start.slots)} slots (resources.slots_per_trial), or use a resource pool "
                "whose agents run trials on the host's network",
                codes=(PERMANENT_ERROR_EXIT_CODE,),
            )
        try:
            target = split_address(start.trial_api)
            return LoopbackNetwork(target, outlets_of(self.config), name=self.id)
        except (OSError, ValueError) as e:
            raise AllocationError(f"cannot give the allocation a network of its own: {e}") from None

    def _close_network(self) -> None:
        if self.network is not None:
            self.network.close()

    def _make_cgroup(self) -> Cgroup | None:
        """The allocation's own cgroup, limited to its share (None without cgroups)."""
        if self.cgroups is None:
            return None
        per_slot = _memory_per_slot(self.config)
        slots = len(self.slots)
        limits = self.allowance.limits(slots, per_slot)
        if per_slot is not None:
            self._asked_memory = per_slot * slots
            if self._asked_memory > self.allowance.memory:
                self._logs.add(
                    self.start_msg.ranks[0],
                    "assay",
                    f"assay: resources.memory asks for {format_size(self._asked_memory)} "
                    f"({format_size(per_slot)} for each of {slots} slot(s)); this agent gives one "
                    f"allocation at most {format_size(self.allowance.memory)} "
                    "(allocation_memory): limited to that",
                )
        try:
            return self.cgroups.create(self.id, limits)
        except OSError as e:
            raise AllocationError(f"cannot make the allocation's cgroup: {e}") from None

    def _env(
        self, local_rank: int, slot: int, rank: int, port: int, spec_path: Path
    ) -> dict[str, str]:
        """The torch.distributed environment of the `local_rank`-th process.

        On GPUs each process sees only its own GPU (CUDA_VISIBLE_DEVICES, indices in
        NVML's PCI-bus order), so it trains on `cuda:0`; LOCAL_RANK still counts the
        processes of this allocation on this agent (0, 1, ...), as torchrun sets it.
        """
        start = self.start_msg
        local_world = len(start.slots)
        # The agent's own secrets stay with the agent: trials run the users' code.
        # Isolated, only what finds Python and its libraries is kept (see _isolation).
        env = self.isolation.environment_for(shareable_environment(), self.dir)
        # The config's environment_variables; those set below win (the config may not name
        # them, and this order keeps it so).
        env.update(_config_environment(self.config, self.slot_kind))
        # The interface other machines reach this one at, for NCCL and Gloo; the config's
        # variables (NCCL_DEBUG, NCCL_SOCKET_IFNAME, ...) and the agent's own stand.
        interface = "lo" if self.network is not None else self.interface
        env.update(nccl_environment(interface, env))
        env.update(
            torchrun_env(
                rank=rank,
                world_size=start.world_size,
                local_rank=local_rank,
                local_world_size=local_world,
                master_addr=start.master_addr or self.address,
                master_port=port,
                run_id=self.id,
            )
        )
        env.update(
            ASSAY_TRIAL_SPEC=str(spec_path),
            ASSAY_ALLOCATION_ID=self.id,
            ASSAY_SLOT_TYPE=self.slot_kind,
            PYTHONUNBUFFERED="1",
        )
        self.tls.export(env)
        if self.network is not None:
            env.update(self.network.environment(self.tls))
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // local_world)))
        if self.slot_kind == "cuda":
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
            env["CUDA_VISIBLE_DEVICES"] = str(slot)
        else:
            env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU slot never trains on a GPU
        return env

    def _watch(self) -> None:
        assert self.processes is not None
        try:
            # Every process it started is gone before its exit is reported: the master
            # may place the next allocation on these slots, and lend nothing of this one.
            report = self.processes.wait(self.grace, ended=self._end_processes)
            self._logs.close()
            message = self._exit_message(report)
            log.info("allocation %s: %s", self.id, message)
            codes = report.codes
            if self._by_agent:
                codes = [PREEMPTED_EXIT_CODE if c == 0 else c for c in codes]
            failure = self._failure(report)
            exited = agent_pb2.ALLOCATION_STATE_EXITED
            self._send(state_change(self.id, exited, codes, message, failure))
        finally:
            self.isolation.give_back(self.identity)  # and whatever it left running
            self._close_network()
            self._remove_cgroup()
            self._remove_dir()
            self._on_done(self.id)

    def _end_processes(self, *, persist: bool = True) -> None:
        """Kill whatever the ranks left running, until none is left: the cgroup's
        processes (again and again while one is stuck, if `persist`), or without one its
        uid's."""
        cgroup = self.cgroup
        if cgroup is not None:
            try:
                self._oom_kills = cgroup.oom_kills()
                while not cgroup.kill() and persist:
                    log.error(
                        "allocation %s: processes %s still live after SIGKILL (stuck in "
                        "the kernel: a hung file system?); it ends once they are gone",
                        self.id,
                        sorted(cgroup.processes()),
                    )
                return
            except OSError as e:  # its exit is reported all the same
                log.error("allocation %s: cannot kill its cgroup (%s): by its uid", self.id, e)
        if self.identity is not None:
            # Without a cgroup, by uid (`give_back` does it too, after the exit is sent).
            kill_processes_of(self.identity.uid)

    def _remove_cgroup(self) -> None:
        if self.cgroup is not None:
            self.cgroup.remove()

    def _exit_message(self, report: ExitReport) -> str:
        assert self.processes is not None
        ranks = list(self.start_msg.ranks)
        if self._kill_reason is not None:
            return self._kill_reason
        if report.failed is None:
            return f"all {len(report.codes)} processes exited with code 0"
        code = report.codes[report.failed]
        message = f"rank {ranks[report.failed]} {describe_exit(code)}"
        if self._oom_kills:
            message += f": {self._memory_reached()}"
        last = self.processes.last_line(report.failed)
        if last:
            message += f"{collective_mismatch_hint(last)}; its last output: {last}"
        message += early_exit_hint([ranks[i] for i in report.early])
        if any(c < 0 for i, c in enumerate(report.codes) if i != report.failed):
            message += "; the other ranks were stopped"
        return message

    def _failure(self, report: ExitReport) -> str:
        """How the first rank to fail ended and the last line it wrote, without the rank
        (another rank may be the first to fail the same way next time); "" if none did,
        or it wrote nothing to compare."""
        assert self.processes is not None
        if self._kill_reason is not None or report.failed is None:
            return ""
        last = self.processes.last_line(report.failed).strip()
        return f"{describe_exit(report.codes[report.failed])}: {last}" if last else ""

    def _memory_reached(self) -> str:
        """What to do about an allocation the kernel killed at its memory limit."""
        assert self.cgroup is not None
        limit = self.cgroup.limits.memory or 0
        said = f"the allocation reached its memory limit of {format_size(limit)}"
        asked = self._asked_memory
        if asked is not None and asked <= limit:
            slots = len(self.slots)
            return f"{said} (resources.memory for {slots} slot(s)); raise resources.memory"
        return (
            f"{said}, the most this agent gives one allocation (its allocation_memory); "
            "use less memory, or ask an administrator to raise allocation_memory"
        )

    def _remove_dir(self) -> None:
        if not self.keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)


__all__ = [
    "Allocation",
    "AllocationError",
    "state_change",
    "trial_spec",
    "validate",
]
