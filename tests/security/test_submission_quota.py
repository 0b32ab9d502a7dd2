"""One user cannot flood the master with experiments or fill its store with archives
(a real `assay-master` process; the limits set low to keep the test short)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
import yaml

from assay.common.archive import pack_model_dir
from assay.master.errors import ResourceExhaustedError
from assay.master.submission import SubmissionQuota
from assay.proto import api_pb2, api_pb2_grpc
from tests.credentials import login
from tests.e2e.conftest import Cluster, start_cluster, stop_cluster

CONFIG = yaml.safe_dump(
    {
        "name": "flood",
        "entrypoint": "model_def:T",
        "hyperparameters": {"global_batch_size": 8},
        "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 4}},
    }
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    limits = {"ASSAY_EXPERIMENTS_PER_MINUTE": "20", "ASSAY_MODEL_DEFINITIONS_MB": "1"}
    tmp = tmp_path_factory.mktemp("quota")
    c = start_cluster(tmp, None, agents=0, slots=1, master_env=limits)
    try:
        with grpc.insecure_channel(c.address) as channel:
            admin = (("authorization", f"Bearer {login(c.address)}"),)
            for name in ("mallory", "trudy"):
                request = api_pb2.CreateUserRequest(username=name, password=f"{name}-pass-1234")
                api_pb2_grpc.ApiStub(channel).CreateUser(request, metadata=admin, timeout=30)
        yield c
    finally:
        stop_cluster(c)


def _submitter(
    cluster: Cluster, user: str | None, folder: Path
) -> tuple[Callable[[], grpc.StatusCode], grpc.Channel]:
    (folder / "model_def.py").write_text("class T:\n    pass\n")
    request = api_pb2.CreateExperimentRequest(
        config_yaml=CONFIG, model_definition=pack_model_dir(folder)
    )
    token = login(cluster.address, *((user, f"{user}-pass-1234") if user else ()))
    channel = grpc.insecure_channel(cluster.address)
    api = api_pb2_grpc.ApiStub(channel)
    metadata = (("authorization", f"Bearer {token}"),)

    def submit() -> grpc.StatusCode:
        try:
            api.CreateExperiment(request, metadata=metadata, timeout=30)
        except grpc.RpcError as e:
            return e.code()
        return grpc.StatusCode.OK

    return submit, channel


def test_a_flood_of_experiments_is_cut_at_the_rate(cluster: Cluster, tmp_path: Path) -> None:
    submit, _ = _submitter(cluster, "mallory", tmp_path)
    codes = [submit() for _ in range(60)]
    assert codes.count(grpc.StatusCode.OK) in range(20, 23)  # 20 at once, a few refilled
    assert set(codes) == {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
    admin_dir = tmp_path / "admin"
    admin_dir.mkdir()
    as_admin, _ = _submitter(cluster, None, admin_dir)
    assert [as_admin() for _ in range(30)] == [grpc.StatusCode.OK] * 30


def test_archives_stop_at_the_users_total(cluster: Cluster, tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(os.urandom(300 * 1024))  # does not compress
    submit, _ = _submitter(cluster, "trudy", tmp_path)
    codes = [submit() for _ in range(5)]
    assert codes[:3] == [grpc.StatusCode.OK] * 3  # 0.9 MiB of the 1 MiB allowed
    assert codes[3:] == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 2


def test_the_rate_refills_over_time() -> None:
    now = [0.0]
    quota = SubmissionQuota(60, 0, lambda owner: 0, clock=lambda: now[0])
    for _ in range(60):
        quota.take(7, False, 10)
    with pytest.raises(ResourceExhaustedError, match="wait 1 s"):
        quota.take(7, False, 10)
    quota.take(8, False, 10)  # another user has a bucket of their own
    now[0] += 1.0
    quota.take(7, False, 10)
