"""`assay-master` settings: each key is defined once here, with its default and its help.

`assay-master --help-config` prints the reference; a value comes from the first of the
flag, the ASSAY_* variable, the YAML file (`--config`, /etc/assay/master.yaml when
installed by deploy/install-master.sh) and the default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
from assay.common.tls import PemFile
from assay.config import METRIC_NAMES_PER_TRIAL
from assay.master.checkpoints import StoragePolicy
from assay.master.fleet import ResourcePools, spec_keys
from assay.master.scheduler import DEFAULT_POOL, Pools, PoolSpec

PORT = Integer(0, 65535)
DEFAULT_PATH = "/etc/assay/master.yaml"


class _Switch(Choice):
    """A choice whose first value is "off": YAML 1.1 reads a bare `off` as false."""

    def parse(self, value: object) -> str:
        return self.values[0] if value is False else super().parse(value)


@dataclass(frozen=True)
class MasterConfig:
    grpc_port: int = setting(
        8090,
        kind=PORT,
        help="Port for agents, trial processes and the CLI (gRPC); agents' `master` names it.",
    )
    http_port: int = setting(
        8080, kind=PORT, help="Port for the web UI and the HTTP API (0: any free port)."
    )
    host: str = setting(
        "0.0.0.0", kind=Text("an address", "ADDRESS"), help="Address both ports listen on."
    )
    state_dir: Path = setting(  # noqa: RUF009 - setting() makes a dataclasses.field
        Path.home() / ".assay" / "master",
        kind=Directory(),
        default_text="~/.assay/master",
        help="The master's own files: the SQLite store when db_url is unset, and the "
        "checkpoints of experiments whose shared_fs storage names no host_path.",
    )
    db_url: str | None = setting(
        kind=Text("an SQLAlchemy URL", "URL"),
        default_text="sqlite:///<state_dir>/assay.db",
        secret=True,
        help="The experiment store: postgresql+psycopg://USER:PASSWORD@HOST/DB for a team, "
        "sqlite:///PATH for one machine.",
    )
    advertised_address: str | None = setting(
        kind=Text("HOST:PORT", "HOST:PORT"),
        default_text="127.0.0.1:<grpc_port>, which only trials on this machine reach",
        help="The address trial processes use to reach the master's gRPC port: set it "
        "whenever agents run on other machines.",
    )
    join_token: str | None = setting(
        kind=Text("a string", "TOKEN"),
        secret=True,
        default_text="made at first start, kept in the store, written to <state_dir>/join-token",
        help="The secret agents present to join the cluster (their `join_token`); an agent "
        "without it is refused.",
    )
    tls_cert: Path | None = setting(  # noqa: RUF009 - setting() makes a dataclasses.field
        kind=PemFile(),
        default_text="none: plain gRPC and HTTP",
        help="The master's certificate chain (PEM, its own certificate first): with "
        "tls_key, gRPC and HTTP are served over TLS. Clients verify it against their "
        "`ca_file` (ASSAY_CA_FILE) or the system's roots; it must name the host they "
        "connect to (advertised_address's too), or they set `tls_server_name`. Read at "
        "start: restart the master after renewing it.",
    )
    tls_key: Path | None = setting(  # noqa: RUF009 - setting() makes a dataclasses.field
        kind=PemFile(),
        default_text="none: plain gRPC and HTTP",
        help="The private key of tls_cert (PEM, without a passphrase; keep the file "
        "readable by the master's user only).",
    )
    initial_admin_password: str | None = setting(
        kind=Text("a password of 8 or more characters", "PASSWORD"),
        secret=True,
        default_text="generated and printed once in the log",
        help="The password of user `admin`, set when the store has no administrator with a "
        "password yet; never changes an existing one.",
    )
    session_ttl_s: float = setting(
        7 * 24 * 3600.0,
        kind=Seconds(),
        help="How long a login's session token is valid (604800: 7 days).",
    )
    heartbeat_interval_s: float = setting(
        5.0, kind=Seconds(), help="How often agents send a heartbeat."
    )
    http_idle_timeout_s: float = setting(
        30.0,
        kind=Seconds(),
        help="An HTTP connection with no request under way for this long is closed: idle "
        "keep-alives and clients that never finish their headers. Answers being written "
        "and followed logs are never cut.",
    )
    kill_grace_s: float = setting(
        30.0,
        kind=Seconds(),
        help="Seconds a stopped trial gets between SIGTERM and SIGKILL.",
    )
    agent_reconnect_wait_s: float = setting(
        30.0,
        kind=Seconds(positive=False),
        help="How long a disconnected agent's trials keep their slots before they are "
        "requeued elsewhere; also how long a restarted master waits for running trials.",
    )
    preemption: bool = setting(
        False,
        kind=Boolean(),
        help="Let a higher-priority trial that does not fit stop lower-priority ones "
        "(they checkpoint and requeue) instead of waiting for free slots, in priority pools "
        "that do not set their own preemption. fair_share pools preempt for fairness "
        "unless they set preemption: false.",
    )
    user_slot_quota: int | None = setting(
        kind=Integer(minimum=1),
        default_text="none: no quota",
        help="Slots the trials of one user's experiments may hold at once, in each resource "
        "pool; a trial that would pass it waits in the queue, which says so.",
    )
    max_rpc_threads: int = setting(
        2048,
        kind=Integer(minimum=8),
        help="gRPC worker threads: each connected agent holds one; the rest serve the "
        "CLI, the web UI and trial processes.",
    )
    metrics: str = setting(
        "off",
        kind=_Switch(("off", "token", "open")),
        help="Serve Prometheus metrics at /metrics on the HTTP port: `token` asks every "
        "scrape for metrics_token (`Authorization: Bearer`); `open` serves anyone who "
        "reaches the port (the cluster's size and load, no user or experiment names).",
    )
    metrics_token: str | None = setting(
        kind=Text("a string of 16 or more characters", "TOKEN"),
        secret=True,
        default_text="made at first start, kept in the store, written to <state_dir>/metrics-token",
        help="The bearer token Prometheus presents with `metrics: token` (its scrape "
        "config's `authorization: {credentials_file: ...}`); it opens /metrics only.",
    )
    s3_endpoints: str | None = setting(
        kind=Text("comma-separated URLs", "URLS"),
        default_text="none: only AWS's own endpoints",
        help="The S3 endpoint_url values experiments may name (e.g. "
        "https://minio.internal:9000); any other is refused at submission, so no user "
        "config points the master's requests at a host of its choosing.",
    )
    shared_fs_host_paths: str | None = setting(
        kind=Text("comma-separated directories", "DIRS"),
        default_text="none: only the master's checkpoint root",
        help="The directories experiments' shared_fs checkpoint_storage.host_path may name "
        "(each with everything under it; the master's own checkpoint root always); any "
        "other is refused at submission, so no user config has agents make directories, "
        "and trials write, where it chooses.",
    )
    s3_master_credential_buckets: str | None = setting(
        kind=Text("comma-separated bucket names", "BUCKETS"),
        default_text="none",
        help="S3 buckets the master may reach with its own credentials (its environment or "
        "instance role) for an experiment whose checkpoint_storage gives no keys; for any "
        "other bucket such an experiment's checkpoints are left alone by the master.",
    )
    experiments_per_minute: int = setting(
        120,
        kind=Integer(minimum=0),
        help="Experiments one user may submit a minute (that many at once, then one every "
        "60/N s; 0: no limit). Admins are not limited.",
    )
    model_definitions_mb: int = setting(
        10240,
        kind=Integer(minimum=0),
        help="Megabytes of model definitions (archives) one user's experiments may store in "
        "all (0: no limit). Admins are not limited.",
    )
    log_quota_mb: int = setting(
        100,
        kind=Integer(minimum=0),
        help="Megabytes of log text one trial may store (0: no limit); the lines past it are "
        "dropped and one line in the log says so. 100 holds a 100-byte line for each of a "
        "million batches.",
    )
    log_retention_days: int = setting(
        -1,
        kind=Integer(-1, 32767),
        help="Days a trial's log is kept after the trial ends (-1: for ever; 0: deleted at "
        "the next hourly cleanup), as Determined's logging_retention.",
    )
    log_followers_per_user: int = setting(
        16,
        kind=Integer(minimum=1),
        help="Trial logs one user may follow at once (web UI trial pages, `assay trial logs "
        "-f`); one more is refused until one ends.",
    )
    metric_names_per_trial: int = setting(
        METRIC_NAMES_PER_TRIAL,
        kind=Integer(minimum=0),
        help="Distinct metric names one trial may report, each group's counted apart (0: no "
        "limit); a report with names past it is refused whole (RESOURCE_EXHAUSTED), the "
        "names reported before are still taken. Each name is a curve on the trial's pages.",
    )
    custom_search_trials: int = setting(
        1000,
        kind=Integer(minimum=0),
        help="Trials one custom search (searcher.name: custom) may create in all, whatever "
        "its searcher.max_trials (0: no limit): a Create past it is refused "
        "(RESOURCE_EXHAUSTED), and so is a config whose max_trials is larger.",
    )
    login_failures_per_minute: int = setting(
        30,
        kind=Integer(minimum=0),
        help="Failed logins a minute, at all user names from all addresses, past which "
        "logins are paced: each login of a user name from an address where it never logged "
        "in waits its turn, one every 0.5 s doubling to 8 s while the failures go on, and "
        "one whose turn is more than 15 s away is refused with when to retry (0: never). A "
        "user logging in from an address she used before is never slowed.",
    )

    resource_pools: list[dict[str, Any]] = setting(  # noqa: RUF009 - setting() makes a field
        factory=list,
        kind=ResourcePools(),
        default_text="none: one pool, default_resource_pool, with the priority scheduler",
        help="The resource pools agents join (their resource_pool) and experiments choose "
        "(resources.resource_pool): a list of {name, description, scheduler: "
        "priority|fair_share, user_slot_quota (this pool's, in place of the master's), "
        "preemption (true|false; default: true for fair_share, else the master's "
        "preemption), workspaces (the workspaces whose experiments may use the pool; "
        "none: every workspace)}. Each pool is scheduled on its own; a trial never spans "
        "pools.",
    )
    default_resource_pool: str = setting(
        DEFAULT_POOL,
        kind=Text("a pool name", "NAME"),
        help="The pool of agents and experiments that name none; one of resource_pools "
        "when that is set.",
    )

    def __post_init__(self) -> None:
        names = [p["name"] for p in self.resource_pools]
        if names and self.default_resource_pool not in names:
            raise SettingsError(
                f"default_resource_pool {self.default_resource_pool!r} is not one of "
                f"resource_pools ({', '.join(names)}): set it to one of them"
            )
        try:
            self.new_pools()
        except ValueError as e:
            raise SettingsError(f"resource_pools: {e}") from None

    @property
    def pool_specs(self) -> tuple[PoolSpec, ...]:
        """The declared pools; with none, the one default pool (priority scheduler)."""
        specs = tuple(PoolSpec(**spec_keys(p)) for p in self.resource_pools)
        return specs or (PoolSpec(self.default_resource_pool),)

    def preempts(self, pool: str) -> bool:
        """Whether waiting trials of pool `pool` may stop running ones (at a checkpoint)."""
        for spec in self.pool_specs:
            if spec.name == pool:
                return spec.preempts(self.preemption)
        return self.preemption

    def new_pools(self) -> Pools:
        """Empty schedulers for the declared pools (ValueError: they contradict)."""
        return Pools(self.pool_specs, self.default_resource_pool)

    @property
    def database_url(self) -> str:
        return self.db_url or f"sqlite:///{self.state_dir / 'assay.db'}"

    @property
    def checkpoint_root(self) -> Path:
        return self.state_dir / "checkpoints"

    @property
    def storage_policy(self) -> StoragePolicy:
        """What storage users' configs may make the master reach (`_storage_policy`)."""
        return StoragePolicy.of(
            self.s3_endpoints,
            self.s3_master_credential_buckets,
            self.shared_fs_host_paths,
            str(self.checkpoint_root),
        )


def load_master_config(
    file: Path | None, flags: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> MasterConfig:
    """Merge the layers; every bad value is reported with where it came from."""
    return load_settings(
        MasterConfig, file=file, flags=flags, env=os.environ if env is None else env
    )


help_config = help_config_option(MasterConfig, program="assay-master", path=DEFAULT_PATH)
