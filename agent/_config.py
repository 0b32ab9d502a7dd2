"""`assay-agent` settings: each key is defined once here, with its default and its help.

`assay-agent --help-config` prints the reference; a value comes from the first of the
flag, the ASSAY_* variable, the YAML file (`--config`, /etc/assay/agent.yaml when
installed by deploy/install-agent.sh) and the default.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import assay
from assay.agent._agent import DEFAULT_GRACE, HARNESS_COMMAND, AgentConfig
from assay.common.settings import (
    Boolean,
    Choice,
    Directory,
    Integer,
    Seconds,
    SettingsError,
    Text,
    help_config_option,
    load_settings,
    setting,
)
from assay.common.tls import ClientTls, PemFile, TlsError

DEFAULT_PATH = "/etc/assay/agent.yaml"


@dataclass(frozen=True)
class AgentSettings:
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
    slot_type: str | None = setting(
        kind=Choice(("cpu", "cuda")),
        default_text="cuda when NVML finds a GPU, else cpu",
        help="Offer GPUs (cuda: refuse to start without one) or CPUs.",
    )
    slots: int | None = setting(
        kind=Integer(minimum=1),
        default_text="every GPU, or one per CPU",
        help="How many slots to offer (the first N GPUs with cuda).",
    )
    work_dir: Path | None = setting(  # noqa: RUF009 - setting() makes a dataclasses.field
        kind=Directory(),
        default_text="<tmp>/assay-agent-<agent_id>",
        help="Where allocations are unpacked and run (leftovers of an earlier run are "
        "removed when the agent starts).",
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
    grace: float = setting(
        DEFAULT_GRACE,
        kind=Seconds(positive=False),
        help="Seconds between SIGTERM and SIGKILL when stopping trials.",
    )
    keep_work_dirs: bool = setting(
        False,
        kind=Boolean(),
        help="Keep each allocation's directory after it exits (debugging).",
    )
    log_level: str = setting(
        "INFO",
        kind=Choice(("DEBUG", "INFO", "WARNING", "ERROR")),
        help="The least severe log messages to print.",
    )

    def agent_config(
        self,
        *,
        harness_command: Sequence[str] = HARNESS_COMMAND,
        version: str = assay.__version__,
    ) -> AgentConfig:
        """The agent's config; raises ValueError for a value only the agent can judge
        (a master that is not HOST:PORT), `SettingsError` for a CA file it cannot use."""
        tls = ClientTls.of(self.tls, self.ca_file, self.tls_server_name)
        try:
            tls.root_certificates()
        except TlsError as e:
            raise SettingsError(str(e)) from None
        return AgentConfig(
            master=self.master,
            agent_id=self.agent_id,
            slot_type="cuda" if self.slot_type == "cuda" else "cpu" if self.slot_type else None,
            slots=self.slots,
            work_dir=self.work_dir,
            address=self.address,
            heartbeat_timeout=self.heartbeat_timeout,
            keep_work_dirs=self.keep_work_dirs,
            harness_command=harness_command,
            grace=self.grace,
            join_token=self.join_token,
            tls=tls,
            version=version,
        )


def load_agent_settings(
    file: Path | None, flags: Mapping[str, object], env: Mapping[str, str] | None = None
) -> AgentSettings:
    """Merge defaults < file < ASSAY_* variables < flags; `SettingsError` names a bad key."""
    return load_settings(
        AgentSettings, file=file, flags=flags, env=os.environ if env is None else env
    )


help_config = help_config_option(AgentSettings, program="assay-agent", path=DEFAULT_PATH)
