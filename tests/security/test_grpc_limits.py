"""Big gRPC messages: an anonymous caller costs the master no memory, and a logged-in
user's model definition comes in bounded pieces (a real `assay-master` process)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import psutil
import pytest

from assay.proto import api_pb2, api_pb2_grpc
from tests.credentials import login
from tests.e2e.conftest import Cluster, start_cluster, stop_cluster

MiB = 2**20
CONFIG = """\
name: big-model-dir
entrypoint: model_def:Model
hyperparameters: {global_batch_size: 8}
searcher: {name: single, metric: loss, max_length: {batches: 4}}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("limits"), None, agents=0, slots=1)
    try:
        yield c
    finally:
        stop_cluster(c)


@pytest.fixture(scope="module")
def mallory(cluster: Cluster) -> str:
    """A regular user's session token."""
    with grpc.insecure_channel(cluster.address) as channel:
        api = api_pb2_grpc.ApiStub(channel)
        admin = (("authorization", f"Bearer {login(cluster.address)}"),)
        request = api_pb2.CreateUserRequest(username="mallory", password="mallory-pass-1234")
        api.CreateUser(request, metadata=admin, timeout=30)
    return login(cluster.address, "mallory", "mallory-pass-1234")


def _channel(cluster: Cluster) -> grpc.Channel:
    big = 200 * MiB
    options = [("grpc.max_send_message_length", big), ("grpc.max_receive_message_length", big)]
    return grpc.insecure_channel(cluster.address, options=options)


def _rss(cluster: Cluster) -> int:
    return int(psutil.Process(cluster.procs[0].pid).memory_info().rss)


def test_anonymous_90_mb_calls_are_refused_without_costing_memory(cluster: Cluster) -> None:
    body = os.urandom(90 * MiB)
    request = api_pb2.CreateExperimentRequest(config_yaml=CONFIG, model_definition=body)
    before = _rss(cluster)
    codes: list[grpc.StatusCode] = []
    with _channel(cluster) as channel:
        api = api_pb2_grpc.ApiStub(channel)

        def call(_: int) -> grpc.StatusCode:
            try:
                api.CreateExperiment(request, timeout=60)
            except grpc.RpcError as e:
                return e.code()
            return grpc.StatusCode.OK

        with futures.ThreadPoolExecutor(4) as pool:
            codes = list(pool.map(call, range(16)))
    grown = _rss(cluster) - before
    assert set(codes) <= {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAUTHENTICATED}
    # 16 x 90 MB bodies once grew the master by 1.8 GB; now none is buffered or parsed.
    # Usually 6-18 MiB, once 101 MiB (likely what the transport had read of 4 bodies in flight
    # when they were refused); a buffered body would cost 90 MiB each, 4 at once 360 MiB.
    assert grown < 200 * MiB, f"the master grew by {grown / MiB:.0f} MiB"
    with grpc.insecure_channel(cluster.address) as channel:  # and it still answers
        info = api_pb2_grpc.ApiStub(channel).GetMasterInfo(
            api_pb2.GetMasterInfoRequest(),
            metadata=(("authorization", f"Bearer {login(cluster.address)}"),),
            timeout=30,
        )
        assert info.version


def test_an_anonymous_call_below_the_limit_is_refused_before_its_body_is_parsed(
    cluster: Cluster,
) -> None:
    # 3.9 MB that do not parse as the request: a refusal that parsed them would say so.
    garbage = b"\xff" * (39 * MiB // 10)
    with grpc.insecure_channel(cluster.address) as channel:
        call = channel.unary_unary("/assay.v1.Api/CreateExperiment")
        with pytest.raises(grpc.RpcError) as refused:
            call(garbage, timeout=30)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_big_model_definition_comes_in_pieces(
    cluster: Cluster, mallory: str, tmp_path: Path
) -> None:
    (tmp_path / "model_def.py").write_text("class Model:\n    pass\n")
    (tmp_path / "weights.bin").write_bytes(os.urandom(10 * MiB))  # does not compress
    env_token = (("authorization", f"Bearer {mallory}"),)
    from assay.common.archive import pack_model_dir

    archive = pack_model_dir(tmp_path)
    assert len(archive) > 10 * MiB
    with _channel(cluster) as channel:
        api = api_pb2_grpc.ApiStub(channel)
        # In one message it is over what the master reads at once: refused, with why.
        whole = api_pb2.CreateExperimentRequest(config_yaml=CONFIG, model_definition=archive)
        with pytest.raises(grpc.RpcError) as refused:
            api.CreateExperiment(whole, metadata=env_token, timeout=60)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # In pieces it is taken, byte for byte.
        pieces = [
            api_pb2.CreateExperimentChunk(model_definition_part=archive[at : at + MiB])
            for at in range(0, len(archive), MiB)
        ]
        pieces[0].config_yaml = CONFIG
        created = api.CreateExperimentStream(iter(pieces), metadata=env_token, timeout=60)
        assert created.experiment.owner == "mallory"
    # What the CLI does on its own for a directory this size.
    done = cluster.cli("experiment", "create", "--paused", str(_config(tmp_path)), str(tmp_path))
    assert done.returncode == 0, done.stderr


def _config(folder: Path) -> Path:
    path = folder.parent / f"{folder.name}.yaml"
    path.write_text(CONFIG)
    return path


def test_a_stream_stops_reading_at_the_model_definition_limit(
    cluster: Cluster, mallory: str
) -> None:
    piece = os.urandom(MiB)

    def pieces() -> Iterator[api_pb2.CreateExperimentChunk]:
        yield api_pb2.CreateExperimentChunk(config_yaml=CONFIG, model_definition_part=piece)
        for _ in range(100):  # 101 MiB in all, over the 96 MiB limit
            yield api_pb2.CreateExperimentChunk(model_definition_part=piece)

    with _channel(cluster) as channel:
        api = api_pb2_grpc.ApiStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            api.CreateExperimentStream(
                pieces(), metadata=(("authorization", f"Bearer {mallory}"),), timeout=120
            )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "96 MiB" in str(refused.value.details())


def test_one_user_holds_at_most_two_uploads_at_once(cluster: Cluster, mallory: str) -> None:
    release = threading.Event()
    metadata = (("authorization", f"Bearer {mallory}"),)

    def held() -> Iterator[api_pb2.CreateExperimentChunk]:
        yield api_pb2.CreateExperimentChunk(config_yaml=CONFIG, model_definition_part=b"x")
        release.wait(60)  # the upload stays open

    with _channel(cluster) as channel:
        api = api_pb2_grpc.ApiStub(channel)
        open_calls = [
            api.CreateExperimentStream.future(held(), metadata=metadata, timeout=90)
            for _ in range(2)
        ]
        try:
            # The third waits until the first two are in: retried until refused.
            for _ in range(50):
                try:
                    api.CreateExperimentStream(iter([]), metadata=metadata, timeout=30)
                except grpc.RpcError as e:
                    if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                        break
                threading.Event().wait(0.1)
            else:
                pytest.fail("a third upload in flight was not refused")
        finally:
            release.set()
        for call in open_calls:  # the held ones end (their archive is not valid)
            with pytest.raises(grpc.RpcError):
                call.result(timeout=60)


def _incompressible_archive(i: int, size: int) -> bytes:
    """A model definition of about `size` bytes that gzip cannot shrink, distinct by `i`
    (stored, not compressed: building it takes no time)."""
    import gzip
    import io
    import tarfile

    buffer = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=0, mtime=0) as packed,
        tarfile.open(fileobj=packed, mode="w") as tar,
    ):
        for name, data in [
            ("model_def.py", f"class Model:\n    pass  # {i}\n".encode()),
            ("weights.bin", os.urandom(size)),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.mark.slow
def test_uploaded_archives_go_to_disk_not_into_the_masters_memory(
    cluster: Cluster, mallory: str
) -> None:
    metadata = (("authorization", f"Bearer {mallory}"),)
    with _channel(cluster) as channel:
        api = api_pb2_grpc.ApiStub(channel)
        api.GetMasterInfo(api_pb2.GetMasterInfoRequest(), metadata=metadata, timeout=30)
        before = _rss(cluster)
        for i in range(10):
            archive = _incompressible_archive(i, 50 * 10**6)
            pieces = [
                api_pb2.CreateExperimentChunk(model_definition_part=archive[at : at + MiB])
                for at in range(0, len(archive), MiB)
            ]
            pieces[0].config_yaml = CONFIG
            created = api.CreateExperimentStream(iter(pieces), metadata=metadata, timeout=120)
        grown = _rss(cluster) - before
        stored = api.GetModelDefinition(
            api_pb2.GetModelDefinitionRequest(experiment_id=created.experiment.id),
            metadata=metadata,
            timeout=60,
        ).model_definition
    assert stored == archive  # the last one, byte for byte
    # Ten 48 MiB archives once stayed in the master: it grew by 357 MiB (SQLite; 347 MiB on
    # PostgreSQL) and gave none of it back. Now each is written to disk as it arrives and
    # into the store in pieces; what remains is the allocator's own (27 MiB in a run of
    # this on SQLite, 15 MiB on PostgreSQL), less than one archive: none is kept.
    assert grown < len(archive), f"the master grew by {grown / MiB:.0f} MiB"
    state = cluster.state_dir
    deadline = time.monotonic() + 10  # an upload's file goes after the commit that stores it
    while list((state / "uploads").iterdir()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list((state / "uploads").iterdir()) == []
    assert len(list((state / "models").glob("*.tar.gz"))) >= 1  # the cache is files
