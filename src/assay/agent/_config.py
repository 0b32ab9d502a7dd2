"""`assay-agent` settings: each key is defined once here, with its default and its help.

`AgentSettings` is the one object the agent is set up with: `assay-agent` loads it,
`Agent` takes it, and the agent's parts are handed the fields they use. Every field is a
key of the file (tests/deploy checks it). `assay-agent
--help-config` prints the reference; a value comes from the first of the flag, the
ASSAY_* variable, the YAML file (`--config`, /etc/assay/agent.yaml when installed by
deploy/install-agent.sh) and the default.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from assay.agent._devices import SlotKind
from assay.common.settings import (
    Boolean,
    Choice,
    Directory,
    FilePath,
    Integer,
    Kind,
    Seconds,
    SettingsError,
    Text,
    help_config_option,
    load_settings,
    setting,
)
from assay.common.tls import ClientTls, PemFile, TlsError
from assay.config import parse_memory

DEFAULT_PATH = "/etc/assay/agent.yaml"


@dataclass(frozen=True)
class MemoryAmount(Kind):
    """A size of memory, or a percentage of the machine's (kept as written, normalised)."""

    @property
    def accepts(self) -> str:
        return "a size (64G, 512Mi) or a share of this machine's memory (90%)"

    @property
    def metavar(self) -> str:
        return "SIZE|PERCENT"

    def parse(self, value: object) -> str:
        if isinstance(value, str) and value.strip().endswith("%"):
            share = float(value.strip()[:-1])  # ValueError when not a number
            if not 0 < share <= 100:
                raise ValueError
            return f"{share:g}%"
        parse_memory(value)  # ValueError when not a size from 16 MiB
        return str(value).strip()


def memory_bytes(amount: str, total: int) -> int:
    """`amount` (as `MemoryAmount` keeps it) in bytes, on a machine of `total` bytes."""
    if amount.endswith("%"):
        return int(total * float(amount[:-1]) / 100)
    return parse_memory(amount)


@dataclass(frozen=True)
class AgentSettings:
    """Everything `assay-agent` is set up with (see `assay-agent --help-config`).

    Construction checks what a key's kind cannot: `master` is HOST:PORT and the CA file
    holds certificates; `SettingsError` says which key is wrong.
    """

    master: str = setting(
        kind=Text("HOST:PORT", "HOST:PORT"),
        required=True,
        help="The master's gRPC address: its host and grpc_port (8090 unless changed).",
    )
    join_token: str | None = setting(
        kind=Text("a string", "TOKEN"),
        secret=True,
        help="The secret this agent presents to join the cluster (the master's "
        "`join_token`); used when the master requires it.",
    )
    agent_id: str = setting(
        factory=socket.gethostname,
        kind=Text("a name", "NAME"),
        default_text="this machine's host name",
        help="This agent's name in the cluster (`assay agent list`); unique per machine.",
    )
    slot_type: SlotKind | None = setting(  # noqa: RUF009 - setting() makes a dataclasses.field
        kind=Choice(("cpu", "cuda")),
        default_text="cuda when NVML finds a GPU, else cpu",
        help="Offer GPUs (cuda: refuse to start without one) or CPUs.",
    )
    slots: int | None = setting(
        kind=Integer(minimum=1),
        default_text="every GPU, or one per CPU",
        help="How many slots to offer (the first N GPUs with cuda).",
    )
    resource_pool: str = setting(
        "default",
        kind=Text("a pool name", "NAME"),
        help="The master's resource pool this agent's slots join (one of the master's "
        "resource_pools; the master refuses any other). Experiments choose a pool with "
        "resources.resource_pool.",
    )
    agent_label: str | None = setting(
        kind=Text("a label", "LABEL"),
        default_text="none",
        help="A label experiments can ask for with resources.agent_label (e.g. a100): "
        "those run only on agents with it; experiments without one run on any agent.",
    )
    work_dir: Path | None = setting(  # noqa: RUF009 - setting() makes a dataclasses.field
        kind=Directory(),
        default_text="<tmp>/assay-agent-<agent_id>",
        help="Where allocations are unpacked and run (leftovers of an earlier run are "
        "removed when the agent starts).",
    )
    credential_file: Path | None = setting(  # noqa: RUF009 - setting() makes a dataclasses.field
        kind=FilePath(),
        default_text="<work_dir>/credential",
        help="Where the agent keeps its own credential (0600), which the master gives it "
        "at its first join with join_token and asks for at every later one: the agent's "
        "name accepts no other until an admin runs `assay agent remove NAME`. Keep it "
        "across restarts; an agent that lost it joins again after that command.",
    )
    address: str | None = setting(
        kind=Text("a host name or IP address", "ADDRESS"),
        env="ASSAY_AGENT_ADDRESS",
        default_text="this machine's address on the route to the master",
        help="The address other agents' trial processes reach this machine at "
        "(torch.distributed rendezvous).",
    )
    tls: bool | None = setting(
        kind=Boolean(),
        default_text="on when ca_file is set",
        help="Connect to the master over TLS (a master with tls_cert), verifying its "
        "certificate against ca_file or the system's roots. Trial processes connect as "
        "the agent does.",
    )
    ca_file: Path | None = setting(  # noqa: RUF009 - setting() makes a dataclasses.field
        kind=PemFile(),
        default_text="none: the system's roots",
        help="The CA certificates (PEM) that signed the master's certificate, for a "
        "cluster with its own CA or a self-signed certificate; setting it turns tls on.",
    )
    tls_server_name: str | None = setting(
        kind=Text("a host name", "NAME"),
        default_text="the host of `master`",
        help="The name the master's certificate must carry, when `master` is an address "
        "the certificate does not name (an IP address).",
    )
    heartbeat_timeout: float = setting(
        30.0,
        kind=Seconds(),
        help="Seconds to wait for the master's reply to registering before trying again.",
    )
    # SIGTERM-to-SIGKILL grace: for a KillAllocation without one, the other ranks of a
    # failed rank, and the allocations still running when the agent stops.
    grace: float = setting(
        30.0,
        kind=Seconds(positive=False),
        help="Seconds between SIGTERM and SIGKILL when stopping trials.",
    )
    keep_work_dirs: bool = setting(
        False,
        kind=Boolean(),
        help="Keep each allocation's directory after it exits (debugging).",
    )
    isolation: str = setting(
        "auto",
        kind=Choice(("auto", "uid", "none")),
        help="uid: each allocation's processes run as a uid of their own, from "
        "isolation_uid_base on, so no trial can read or signal another's processes and "
        "files, or the agent's and a co-located master's (needs root). none: every trial "
        "runs as the agent's user and can read all of that (single-tenant: one user's "
        "machine). auto: uid when the agent runs as root, else none.",
    )
    isolation_uid_base: int = setting(
        1_900_000_000,
        kind=Integer(minimum=1000),
        help="The first uid (and gid) lent to allocations; no account on the machine may "
        "use the range from it. Every agent of a cluster uses the same range (an "
        "experiment's gid comes from it); agents on one machine claim each uid there, so "
        "they never lend the same one.",
    )
    isolation_uids: int = setting(
        1_000_000,
        kind=Integer(minimum=1),
        help="How many uids from isolation_uid_base are lent; experiments share gids from "
        "the same range (an experiment's id modulo this).",
    )
    isolation_network: str = setting(
        "host",
        kind=Choice(("host", "loopback")),
        help="loopback: each isolated allocation runs in a network namespace of its own "
        "that holds only its own loopback, so its code reaches no TCP or UDP service of "
        "this machine (a database trusting local connections, other trials' ports) or "
        "beyond, save the master's trial API and its experiment's S3 checkpoint storage, "
        "which the agent relays; its ranks meet on that loopback. A trial whose ranks span "
        "several agents cannot run so and is refused: keep such trials in a pool of "
        "agents with host. Needs isolation: uid. host: trials use this machine's network.",
    )
    cgroups: str = setting(
        "auto",
        kind=Choice(("auto", "on", "off")),
        help="on: each allocation runs in a cgroup of its own (Linux, cgroup v2 or v1; "
        "needs root and a writable /sys/fs/cgroup), which holds it to allocation_memory "
        "and pids_per_slot; when it ends, the kernel kills every process in it, and it "
        "counts as ended only once none is left. off: no limits, and what an allocation "
        "leaves running is killed by its uid alone. auto: on with isolation uid (an agent "
        "that cannot make cgroups then refuses to start, saying why), else off.",
    )
    allocation_memory: str = setting(
        "90%",
        kind=MemoryAmount(),
        help="The most memory one allocation's processes may use together, page cache "
        "included, with cgroups: a size (64G, 512Mi: powers of 1024) or a share of this "
        "machine's memory (90%). An allocation gets its experiment's resources.memory "
        "times its slots on this agent, at most this, and this when the experiment sets "
        "none. Past it the kernel kills one of its processes, and the trial's exit "
        "message says so.",
    )
    pids_per_slot: int = setting(
        4096,
        kind=Integer(minimum=0),
        help="The most processes and threads one allocation may run, per slot it holds on "
        "this agent, with cgroups: a fork bomb stops there. A PyTorch process with "
        "DataLoader workers and OpenMP threads uses a few hundred. 0: no limit.",
    )
    log_level: str = setting(
        "INFO",
        kind=Choice(("DEBUG", "INFO", "WARNING", "ERROR")),
        help="The least severe log messages to print.",
    )

    def __post_init__(self) -> None:
        host, sep, port = self.master.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise SettingsError(f"master must be HOST:PORT, got {self.master!r}")
        if self.slots is not None and self.slots < 1:
            raise SettingsError(f"slots must be at least 1, got {self.slots}")
        for key in ("resource_pool", "agent_label"):
            value = getattr(self, key)
            if value is not None and (not value.strip() or value != value.strip()):
                raise SettingsError(
                    f"{key} must be a name without surrounding spaces, got {value!r}"
                )
        if self.heartbeat_timeout <= 0:
            raise SettingsError(f"heartbeat_timeout must be positive, got {self.heartbeat_timeout}")
        try:
            self.client_tls.root_certificates()
        except TlsError as e:
            raise SettingsError(str(e)) from None

    @property
    def client_tls(self) -> ClientTls:
        """How the agent, and the trial processes it starts, reach the master."""
        return ClientTls.of(self.tls, self.ca_file, self.tls_server_name)


def load_agent_settings(
    file: Path | None, flags: Mapping[str, object], env: Mapping[str, str] | None = None
) -> AgentSettings:
    """Merge defaults < file < ASSAY_* variables < flags; `SettingsError` names a bad key."""
    return load_settings(
        AgentSettings, file=file, flags=flags, env=os.environ if env is None else env
    )


help_config = help_config_option(AgentSettings, program="assay-agent", path=DEFAULT_PATH)


__all__ = [
    "DEFAULT_PATH",
    "AgentSettings",
    "MemoryAmount",
    "help_config",
    "load_agent_settings",
    "memory_bytes",
]
