"""Shared helpers: the regression fixture's model directory and config builder, a local
S3-compatible server (moto's server mode, on loopback) for checkpoint storage, and the
tiers every test is sorted into.

Tiers (markers, set here by folder and file; `-m unit`, `-m "not e2e"`, ...), each with a
timeout of its own per test (`TIMEOUTS`; an explicit `@pytest.mark.timeout` wins):
- `unit` (60 s): in-process code only; no socket, database, or process of its own.
  Folders lifecycle/, scheduler/, searcher/ and strategy/ (but see below), and at the top
  test_activation_checkpointing, test_archive_malicious, test_checkpoint_metadata,
  test_config, test_config_resources, test_data, test_gc; and cli/test_format,
  cli/test_overrides, client/test_searcher_ops, agent/test_credential,
  store/test_downsample, master/test_aio, test_continue, test_convert, test_state_dir,
  test_status, test_submission.
- `integration` (180 s): one real database or one real server in the test's process
  (a master, an HTTP site, a fake master for a real agent, a fake API for the CLI run as
  a process, moto's S3), or a whole trial run in-process by `run_local`.
  Folders agent/, cli/, http/, master/, registry/, store/, workspaces/; and
  lifecycle/test_simulate, searcher/ test_bohb, test_multi_store, test_peer_bench,
  test_restore, test_tpe, strategy/test_sharded_storage, deploy/test_manifests,
  deploy/test_monitoring, security/ test_registry_tenants, test_usage_tenants,
  test_workspace_tenants; at the top test_archive, test_context, test_ground_truth,
  test_load, test_precision, test_precision_auto, test_proto, test_rank_metrics,
  test_storage, test_tensorboard, test_trial_compat.
- `e2e` (300 s): real master, agent, harness, launcher or installer processes, a
  browser. Folders e2e/, webui/, deploy/, security/; and agent/test_isolation,
  cli/ test_default_master, test_local_cluster, test_real_master, client/test_sdk,
  registry/test_cli_e2e, store/test_store_owner, strategy/ test_core_setup,
  test_exit_threads, test_fsdp_ground_truth, test_group_teardown, test_sharded; at the top
  test_bench_gpu, test_bench_scheduling_relay, test_checkpoint, test_cli,
  test_cluster_session, test_config_determined, test_config_entrypoint, test_core,
  test_example, test_fail_fast, test_launcher, test_lightning, test_packaging,
  test_readme, test_run_local_ux, test_tls, test_trainer_api, test_validation_weights.
`slow` stays as it was: a test marked so by hand, whatever its tier.

`pytest` runs on every core (xdist's `-n auto --dist loadgroup`, `pytest_cmdline_main`
below; `-n 0` or `-p no:xdist` runs in one process). A worker is a test session of its
own: its own temporary directories, PostgreSQL database (tests/store/conftest.py), auth
file and free ports. The tests of one file run on one worker (so that a module's cluster
or master starts once), unit tests anywhere; `SHARED_GROUPS` keeps the files that use
what the machine has only one of on one worker.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.credentials import ADMIN_PASSWORD, JOIN_TOKEN

# Every master, agent and CLI process a test starts inherits these: the cluster's join
# token, the first admin's password, and a login for the CLI (tokens in a file of this
# session's own, never the user's ~/.assay/auth.json).
os.environ["ASSAY_JOIN_TOKEN"] = JOIN_TOKEN
os.environ["ASSAY_INITIAL_ADMIN_PASSWORD"] = ADMIN_PASSWORD
os.environ["ASSAY_USER"] = "admin"
os.environ["ASSAY_PASSWORD"] = ADMIN_PASSWORD
# Test trials write into the tests' own (root-only) directories: agents run them as
# their own user unless a test isolates them (tests/security/test_isolation.py).
os.environ["ASSAY_ISOLATION"] = "none"
os.environ["ASSAY_AUTH_FILE"] = str(Path(tempfile.mkdtemp(prefix="assay-auth-")) / "auth.json")

FIXTURES = Path(__file__).parent / "fixtures"
REGRESSION_DIR = FIXTURES / "regression"

TIMEOUTS = {"unit": 60, "integration": 180, "e2e": 300}
# A folder's tier (its first level under tests/), unless FILE_TIERS names the file.
FOLDER_TIERS = {
    "agent": "integration",
    "cli": "integration",
    "client": "unit",
    "deploy": "e2e",
    "e2e": "e2e",
    "http": "integration",
    "lifecycle": "unit",
    "master": "integration",
    "registry": "integration",
    "scheduler": "unit",
    "searcher": "unit",
    "security": "e2e",
    "store": "integration",
    "strategy": "unit",
    "webui": "e2e",
    "workspaces": "integration",
}
_FILES = {
    "unit": """
        test_activation_checkpointing test_archive_malicious test_checkpoint_metadata
        test_config test_config_resources test_data test_gc cli/test_format
        cli/test_overrides agent/test_credential store/test_downsample master/test_aio
        master/test_continue master/test_convert master/test_state_dir master/test_status
        master/test_submission""",
    "integration": """
        lifecycle/test_simulate searcher/test_bohb searcher/test_multi_store
        searcher/test_peer_bench searcher/test_restore searcher/test_tpe
        strategy/test_sharded_storage deploy/test_manifests deploy/test_monitoring
        security/test_registry_tenants security/test_usage_tenants
        security/test_workspace_tenants test_archive test_context test_ground_truth
        test_load test_precision test_precision_auto test_proto test_rank_metrics
        test_storage test_tensorboard test_trial_compat""",
    "e2e": """
        agent/test_isolation cli/test_default_master cli/test_local_cluster
        cli/test_real_master client/test_sdk registry/test_cli_e2e store/test_store_owner
        strategy/test_core_setup strategy/test_exit_threads strategy/test_fsdp_ground_truth
        strategy/test_group_teardown
        strategy/test_sharded test_bench_gpu test_bench_scheduling_relay test_checkpoint
        test_cli test_cluster_session test_config_determined test_config_entrypoint
        test_core test_example test_fail_fast test_launcher test_lightning test_packaging
        test_readme test_run_local_ux test_tls test_trainer_api test_validation_weights""",
}
# A file's tier by its path under tests/, without ".py".
FILE_TIERS = {name: tier for tier, names in _FILES.items() for name in names.split()}
# Files whose tests must never run at the same time as one another, on one worker (an
# xdist_group) under xdist:
# - "uids": the machine's isolation uids (1_900_000_000 up) and its turn file
#   /run/assay/uids.next: an agent lending a uid kills what still lives under it, and
#   these tests run processes under those uids, or count on the turn;
# - "wheel": `pip wheel` of the checkout, whose build/ folder and egg-info are shared.
SHARED_GROUPS = {
    "agent/test_isolation": "uids",
    "security/test_isolation": "uids",
    "deploy/test_install": "wheel",
    "test_packaging": "wheel",
}
TESTS = Path(__file__).parent


def tier_of(path: Path) -> str:
    """The tier of the test file at `path`: its own, else its folder's, else unit."""
    relative = path.relative_to(TESTS).with_suffix("").as_posix()
    if relative in FILE_TIERS:
        return FILE_TIERS[relative]
    return FOLDER_TIERS.get(relative.split("/")[0], "unit")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """`pytest` alone runs on every core: `-n auto --dist loadgroup`, unless `-n` was
    given, xdist is off (`-p no:xdist`), or this is a worker, a collection or a debugger.
    (Not in addopts, which would make `-p no:xdist` an error.)"""
    option = config.option
    if not config.pluginmanager.has_plugin("xdist") or hasattr(config, "workerinput"):
        return
    if option.numprocesses is not None or option.collectonly or option.usepdb:
        return
    option.numprocesses = "auto"
    if option.dist == "no":
        option.dist = "loadgroup"


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups into the test ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test with its tier, and give it its tier's timeout unless it has one.

    Under xdist, a test outside every `xdist_group` gets its file's (SHARED_GROUPS, else
    the file itself): a file's tests share one worker, so what a module-scoped fixture
    starts (a cluster, a master) is started once. Unit tests stay free to spread."""
    for item in items:
        tier = tier_of(item.path)
        item.add_marker(getattr(pytest.mark, tier))
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TIMEOUTS[tier]))
        if item.get_closest_marker("xdist_group") is not None:
            continue
        name = item.path.relative_to(TESTS).with_suffix("").as_posix()
        if name in SHARED_GROUPS:
            item.add_marker(pytest.mark.xdist_group(SHARED_GROUPS[name]))
        elif tier != "unit":
            item.add_marker(pytest.mark.xdist_group(name))


def regression_config(
    *,
    batches: int,
    global_batch_size: int = 16,
    slots: int = 1,
    aggregation: int = 1,
    precision: str = "off",
    scheduling_unit: int = 4,
    validation_period: int | None = None,
    checkpoint_period: int | None = None,
    seed: int = 3,
    **hparams: Any,
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": "regression",
        "entrypoint": "model_def:RegressionTrial",
        "hyperparameters": {"global_batch_size": global_batch_size, "lr": 0.05, **hparams},
        "searcher": {
            "name": "single",
            "metric": "val_loss",
            "max_length": {"batches": batches},
        },
        "resources": {"slots_per_trial": slots},
        "optimizations": {"aggregation_frequency": aggregation, "mixed_precision": precision},
        "scheduling_unit": scheduling_unit,
        "reproducibility": {"experiment_seed": seed},
    }
    if validation_period:
        config["min_validation_period"] = {"batches": validation_period}
    if checkpoint_period:
        config["min_checkpoint_period"] = {"batches": checkpoint_period}
    return config


@pytest.fixture
def regression_dir() -> Path:
    return REGRESSION_DIR


@dataclass(frozen=True)
class S3Server:
    """A running S3-compatible server; any key pair is accepted."""

    endpoint_url: str
    access_key: str = "assay-test-key"
    secret_key: str = "assay-test-secret"
    region: str = "us-east-1"

    def client(self) -> Any:
        import boto3

        return boto3.session.Session(
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
        ).client("s3", endpoint_url=self.endpoint_url)

    def new_bucket(self) -> str:
        name = f"assay-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str) -> list[str]:
        answer = self.client().list_objects_v2(Bucket=bucket)
        return sorted(obj["Key"] for obj in answer.get("Contents", []))

    def storage_config(self, bucket: str, prefix: str = "runs") -> dict[str, Any]:
        """A `checkpoint_storage` mapping for this server."""
        return {
            "type": "s3",
            "bucket": bucket,
            "prefix": prefix,
            "endpoint_url": self.endpoint_url,
            "region": self.region,
            "access_key": self.access_key,
            "secret_key": self.secret_key,
        }


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield S3Server(f"http://{host}:{port}")
    finally:
        server.stop()
