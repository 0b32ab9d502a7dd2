"""`assay-master` settings: defaults, then a YAML file, then ASSAY_* variables, then flags."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml

from assay.errors import AssayError


@dataclass(frozen=True)
class MasterConfig:
    grpc_port: int = 8090
    http_port: int = 8080
    host: str = "0.0.0.0"
    state_dir: Path = Path.home() / ".assay" / "master"
    db_url: str | None = None  # default: sqlite under state_dir
    # The address agents and harness processes use to reach this master's gRPC port.
    advertised_address: str | None = None
    heartbeat_interval_s: float = 5.0
    kill_grace_s: float = 30.0
    # How long a disconnected (or silent) agent's trials keep their slots before they
    # are requeued elsewhere; also how long a restarted master waits for running trials.
    agent_reconnect_wait_s: float = 30.0
    # Let a higher-priority trial that does not fit stop lower-priority ones (they
    # checkpoint and requeue) instead of waiting for free slots.
    preemption: bool = False
    # Each connected agent holds one; the rest serve the CLI, the UI and the harness.
    max_rpc_threads: int = 2048

    @property
    def database_url(self) -> str:
        return self.db_url or f"sqlite:///{self.state_dir / 'assay.db'}"

    @property
    def checkpoint_root(self) -> Path:
        return self.state_dir / "checkpoints"


_ENV = {
    "grpc_port": "ASSAY_GRPC_PORT",
    "http_port": "ASSAY_HTTP_PORT",
    "host": "ASSAY_HOST",
    "state_dir": "ASSAY_STATE_DIR",
    "db_url": "ASSAY_DB_URL",
    "advertised_address": "ASSAY_ADVERTISED_ADDRESS",
    "heartbeat_interval_s": "ASSAY_HEARTBEAT_INTERVAL_S",
    "kill_grace_s": "ASSAY_KILL_GRACE_S",
    "agent_reconnect_wait_s": "ASSAY_AGENT_RECONNECT_WAIT_S",
    "preemption": "ASSAY_PREEMPTION",
    "max_rpc_threads": "ASSAY_MAX_RPC_THREADS",
}


def load_master_config(
    file: Path | None, flags: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> MasterConfig:
    """Merge the layers; every bad value is reported with where it came from."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    if file is not None:
        try:
            data = yaml.safe_load(file.read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise AssayError(f"cannot read master config {file}: {e}") from None
        if not isinstance(data, Mapping):
            raise AssayError(f"master config {file} must be a mapping of settings")
        values.update(_checked(data, f"{file}"))
    values.update(_checked({k: env[v] for k, v in _ENV.items() if v in env}, "environment"))
    values.update(_checked({k: v for k, v in flags.items() if v is not None}, "flags"))
    return replace(MasterConfig(), **values)


def _checked(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    known = {f.name: f for f in fields(MasterConfig)}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in known:
            raise AssayError(f"{where}: unknown master setting {key!r}; known: {', '.join(known)}")
        try:
            if key == "max_rpc_threads":
                out[key] = int(value)
                if out[key] < 8:
                    raise ValueError("at least 8")
            elif key in ("grpc_port", "http_port"):
                out[key] = int(value)
                if not 0 <= out[key] <= 65535:
                    raise ValueError("a port is 0-65535")
            elif key in ("heartbeat_interval_s", "kill_grace_s"):
                out[key] = float(value)
                if out[key] <= 0:
                    raise ValueError("must be positive")
            elif key == "agent_reconnect_wait_s":
                out[key] = float(value)
                if out[key] < 0:
                    raise ValueError("must be 0 (no waiting) or more")
            elif key == "preemption":
                out[key] = _bool(value)
            elif key == "state_dir":
                out[key] = Path(value).expanduser()
            else:
                out[key] = str(value)
        except ValueError as e:
            raise AssayError(f"{where}: {key}={value!r} is invalid: {e}") from None
    return out


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected true or false")
