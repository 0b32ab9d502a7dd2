"""Shared helpers: the regression fixture's model directory and config builder, and a
local S3-compatible server (moto's server mode, on loopback) for checkpoint storage."""

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
