"""A user's checkpoint storage cannot aim the master's requests at a host of the user's
choosing, nor borrow the master's own S3 credentials (a real `assay-master` process for
the submission; the master's storage rule for garbage collection and deletion)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml

from assay.common.archive import pack_model_dir
from assay.common.storage import StorageError
from assay.config import CheckpointStorageConfig
from assay.master.checkpoints import StorageCache, StoragePolicy
from assay.proto import api_pb2, api_pb2_grpc
from tests.credentials import login
from tests.e2e.conftest import Cluster, start_cluster, stop_cluster


class Listener:
    """A TCP port inside the network that counts the connections it gets."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.socket.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    allowed = {
        "ASSAY_S3_ENDPOINTS": "https://minio.internal:9000",
        "ASSAY_SHARED_FS_HOST_PATHS": "/mnt/team-checkpoints, /srv/ckpt/",
    }
    c = start_cluster(tmp_path_factory.mktemp("ssrf"), None, agents=0, slots=1, master_env=allowed)
    try:
        with grpc.insecure_channel(c.address) as channel:
            admin = (("authorization", f"Bearer {login(c.address)}"),)
            request = api_pb2.CreateUserRequest(username="mallory", password="mallory-pass-1234")
            api_pb2_grpc.ApiStub(channel).CreateUser(request, metadata=admin, timeout=30)
        yield c
    finally:
        stop_cluster(c)


def _submit(cluster: Cluster, storage: dict[str, str], tmp: Path) -> grpc.RpcError | None:
    (tmp / "model_def.py").write_text("class T:\n    pass\n")
    config = {
        "name": "ssrf",
        "entrypoint": "model_def:T",
        "hyperparameters": {"global_batch_size": 8},
        "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 4}},
        "checkpoint_storage": {"type": "s3", **storage} if "type" not in storage else storage,
    }
    token = login(cluster.address, "mallory", "mallory-pass-1234")
    with grpc.insecure_channel(cluster.address) as channel:
        request = api_pb2.CreateExperimentRequest(
            config_yaml=yaml.safe_dump(config), model_definition=pack_model_dir(tmp)
        )
        try:
            api_pb2_grpc.ApiStub(channel).CreateExperiment(
                request, metadata=(("authorization", f"Bearer {token}"),), timeout=30
            )
        except grpc.RpcError as e:
            return e
    return None


def test_an_endpoint_the_master_does_not_allow_is_refused_at_submission(
    cluster: Cluster, tmp_path: Path
) -> None:
    inside = Listener()  # e.g. a database or a metadata service on the master's network
    refused = _submit(
        cluster,
        {"bucket": "ckpts", "endpoint_url": f"http://127.0.0.1:{inside.port}"},
        tmp_path,
    )
    assert refused is not None
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "is not an endpoint this master reaches" in str(refused.details())
    assert "https://minio.internal:9000" in str(refused.details())
    assert inside.connections == 0
    # One the administrator listed is taken.
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    ok = {"bucket": "ckpts", "endpoint_url": "https://minio.internal:9000/", "access_key": "k"}
    assert _submit(cluster, {**ok, "secret_key": "s"}, allowed) is None


def test_the_master_never_lends_its_credentials_to_a_users_bucket() -> None:
    policy = StoragePolicy.of("https://minio.internal:9000", "cluster-checkpoints")
    cache = StorageCache(None, policy=policy)
    keyless = CheckpointStorageConfig(type="s3", bucket="someone-elses-bucket")
    with pytest.raises(StorageError, match="does not lend its own credentials"):
        cache.of(keyless)
    # Its own bucket, or a config with its own keys: reached.
    assert cache.of(CheckpointStorageConfig(type="s3", bucket="cluster-checkpoints"))
    with_keys = CheckpointStorageConfig(
        type="s3", bucket="someone-elses-bucket", access_key="k", secret_key="s"
    )
    assert cache.of(with_keys)
    # An endpoint dropped from the settings since the submission: not reached either.
    moved = CheckpointStorageConfig(
        type="s3", bucket="b", endpoint_url="http://10.0.0.1:80", access_key="k", secret_key="s"
    )
    with pytest.raises(StorageError, match="is not an endpoint this master reaches"):
        cache.of(moved)


@pytest.mark.parametrize(
    ("storage", "refused"),
    [
        ({"host_path": "/etc"}, "'/etc' is not a directory this cluster keeps checkpoints in"),
        ({"host_path": "/mnt/team-checkpoints/../../etc"}, "'/etc' is not"),
        ({"host_path": "/mnt/team-checkpointsX"}, "is not a directory this cluster"),
        ({"host_path": "/mnt/team-checkpoints", "storage_path": "../x"}, "without '..'"),
        ({"host_path": "relative"}, "expected an absolute path"),
        ({"host_path": "/mnt/team-checkpoints"}, None),
        ({"host_path": "/mnt/team-checkpoints", "storage_path": "runs/a"}, None),
        ({"host_path": "/srv/ckpt"}, None),
    ],
)
def test_a_shared_fs_place_the_master_does_not_allow_is_refused_at_submission(
    cluster: Cluster, tmp_path: Path, storage: dict[str, str], refused: str | None
) -> None:
    """A user's host_path would have the agents (as root, when they isolate trials) make
    directories there for trials to write into: /etc, another experiment's directory."""
    error = _submit(cluster, {"type": "shared_fs", **storage}, tmp_path)
    if refused is None:
        assert error is None
        return
    assert error is not None
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused in str(error.details())


def test_the_masters_own_root_is_allowed_but_not_an_experiment_directory_in_it() -> None:
    policy = StoragePolicy.of(None, None, None, "/var/lib/assay/checkpoints")
    own = CheckpointStorageConfig(host_path="/var/lib/assay/checkpoints")
    assert policy.submission_problem(own) is None
    assert policy.submission_problem(CheckpointStorageConfig()) is None  # the default
    other = CheckpointStorageConfig(host_path="/var/lib/assay/checkpoints/3")
    assert "shared_fs_host_paths: none" in str(policy.submission_problem(other))


def test_an_experiment_stored_before_the_host_path_rule_keeps_its_collection() -> None:
    """The rule is checked at submission: the master still collects and deletes the
    checkpoints of an experiment whose host_path was taken before the setting."""
    policy = StoragePolicy.of(None, None, "/mnt/new", "/var/lib/assay/checkpoints")
    older = CheckpointStorageConfig(host_path="/mnt/nfs")
    assert policy.submission_problem(older) is not None
    assert policy.use_problem(older) is None
    assert StorageCache(None, policy=policy).of(older) is not None
