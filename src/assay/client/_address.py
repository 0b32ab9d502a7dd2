"""Which master a call goes to: `--master`, else ASSAY_MASTER, else the local cluster that
`assay deploy local up` started and that still runs, else 127.0.0.1:8090.

The CLI, the SDK and `assay.load_checkpoint` all find the master through `master_address`,
so a script and a command typed next to it reach the same one.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

# Where `assay deploy local up` starts the master unless its --port says otherwise.
DEFAULT_MASTER = "127.0.0.1:8090"
# Where `assay deploy local up` keeps its pids, logs and the cluster's address.
DEFAULT_STATE = Path.home() / ".assay" / "local"
CLUSTER_FILE = "cluster.json"


@dataclass(frozen=True)
class LocalCluster:
    """Where a local cluster answers: the gRPC address and the web UI's URL."""

    master: str
    ui_url: str | None


def running_cluster(state_dir: Path = DEFAULT_STATE) -> LocalCluster | None:
    """The cluster `up` started from `state_dir`, if its master still runs. Two small
    files and a signal 0, so that every command starts as fast as before."""
    pids_file, cluster_file = state_dir / "pids.json", state_dir / CLUSTER_FILE
    try:
        pids = json.loads(pids_file.read_text())
        found = json.loads(cluster_file.read_text())
        return (
            LocalCluster(str(found["master"]), found.get("ui_url"))
            if _alive(int(pids["master"]))
            else None
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def local_master(state_dir: Path = DEFAULT_STATE) -> str | None:
    """The address of the master `up` started from `state_dir`, if it still runs: the
    master when neither --master nor ASSAY_MASTER names one."""
    cluster = running_cluster(state_dir)
    return cluster.master if cluster is not None else None


def default_master() -> str:
    """The master when neither --master nor ASSAY_MASTER names one: the local cluster's
    that `assay deploy local up` started and that still runs (its --port), else
    DEFAULT_MASTER."""
    return local_master() or DEFAULT_MASTER


def master_address(master: str | None = None) -> str:
    """`master` if given, else ASSAY_MASTER, else `default_master()`: the one rule the CLI,
    the Python SDK and `assay.load_checkpoint` use to find the master."""
    return master or os.environ.get("ASSAY_MASTER") or default_master()


def poll_seconds() -> float:
    """How often `--follow` and `wait` poll the master (ASSAY_POLL_SECONDS, default 1)."""
    try:
        return max(0.01, float(os.environ.get("ASSAY_POLL_SECONDS", "1")))
    except ValueError:
        return 1.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True
