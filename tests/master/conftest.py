"""A real master on loopback, and a scripted agent that speaks the real agent protocol."""

from __future__ import annotations

import io
import queue
import tarfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from assay.master._server import MasterServer
from assay.proto import (
    agent_pb2,
    agent_pb2_grpc,
    api_pb2,
    api_pb2_grpc,
    common_pb2,
    trial_pb2,
    trial_pb2_grpc,
)
from tests.credentials import (
    JOIN_METADATA,
    authed_channel,
    master_config,
)
from tests.store.conftest import seeded


@pytest.fixture
def master(tmp_path: Path) -> Iterator[MasterServer]:
    config = master_config(
        state_dir=seeded(tmp_path / "master"),
        heartbeat_interval_s=0.5,
        agent_reconnect_wait_s=1.0,
    )
    server = MasterServer(config)
    server.start()
    yield server
    server.stop(grace=0.5)


@pytest.fixture
def api(master: MasterServer) -> Iterator[api_pb2_grpc.ApiStub]:
    channel = authed_channel(f"127.0.0.1:{master.port}")
    yield api_pb2_grpc.ApiStub(channel)
    channel.close()


# The credential each agent name was last given: a scripted agent back under the same
# name presents it, as a real agent presents its credential file. A master of another
# test has its own store, where the name holds none: the join token gets a new one.
CREDENTIALS: dict[str, str] = {}


class ScriptedAgent:
    """Registers with N CPU slots and records what the master tells it.

    It presents the join token and the credential last given to its name, unless told
    another `credential` ("" none) or `join=False`."""

    def __init__(
        self,
        port: int,
        agent_id: str,
        slots: int,
        running: Sequence[str] = (),
        *,
        credential: str | None = None,
        join: bool = True,
        pool: str = "",
        label: str = "",
        slot_type: common_pb2.SlotType.ValueType = common_pb2.SLOT_TYPE_CPU,
    ) -> None:
        self.id = agent_id
        self.error: grpc.RpcError | None = None  # what ended the stream, if the master did
        presented = CREDENTIALS.get(agent_id, "") if credential is None else credential
        metadata = [*JOIN_METADATA] if join else []
        if presented:
            metadata.append(("x-assay-agent-credential", presented))
        self.outgoing: queue.Queue[agent_pb2.AgentMessage | None] = queue.Queue()
        self.incoming: queue.Queue[agent_pb2.MasterMessage] = queue.Queue()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub = agent_pb2_grpc.AgentServiceStub(self.channel)
        devices = [common_pb2.Device(index=i, type=slot_type, name="device") for i in range(slots)]
        self.send(
            agent_pb2.AgentMessage(
                register=agent_pb2.Register(
                    agent_id=agent_id,
                    slot_type=slot_type,
                    devices=devices,
                    address="127.0.0.1",
                    running_allocations=list(running),
                    resource_pool=pool,
                    agent_label=label,
                )
            )
        )
        self.stream = stub.Connect(self._requests(), metadata=metadata)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        registered = self.next("registered")
        assert registered.registered.heartbeat_interval_ms > 0
        self.credential = registered.registered.credential or presented
        CREDENTIALS[agent_id] = self.credential
        self.closed = threading.Event()
        interval = registered.registered.heartbeat_interval_ms / 1000
        threading.Thread(target=self._beat, args=(interval,), daemon=True).start()

    def _beat(self, interval: float) -> None:
        while not self.closed.wait(interval):
            self.send(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat()))

    def _requests(self) -> Iterator[agent_pb2.AgentMessage]:
        while True:
            message = self.outgoing.get()
            if message is None:
                return
            yield message

    def _read(self) -> None:
        try:
            for message in self.stream:
                self.incoming.put(message)
        except grpc.RpcError as e:
            self.error = e

    def send(self, message: agent_pb2.AgentMessage) -> None:
        self.outgoing.put(message)

    def next(self, kind: str, timeout: float = 10.0) -> agent_pb2.MasterMessage:
        message = self.incoming.get(timeout=timeout)
        assert message.WhichOneof("message") == kind, message
        return message

    def nothing(self, wait: float = 0.5) -> None:
        try:
            message = self.incoming.get(timeout=wait)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected message: {message}")

    def exited(
        self, allocation_id: str, codes: list[int], message: str = "", failure: str = ""
    ) -> None:
        self.send(
            agent_pb2.AgentMessage(
                allocation_state=agent_pb2.AllocationStateChange(
                    allocation_id=allocation_id,
                    state=agent_pb2.ALLOCATION_STATE_EXITED,
                    exit_codes=codes,
                    message=message,
                    failure=failure,
                )
            )
        )

    def close(self) -> None:
        self.closed.set()
        self.outgoing.put(None)
        self.channel.close()


def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait until `check()` is true (polling), or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


def model_archive(files: dict[str, str] | None = None) -> bytes:
    files = files or {"model_def.py": "# the Trial lives here\n"}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def experiment_yaml(**overrides: Any) -> str:
    config: dict[str, Any] = {
        "name": "test",
        "entrypoint": "model_def:T",
        "hyperparameters": {"global_batch_size": 8, "lr": 0.1},
        "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 100}},
        "max_restarts": 1,
    }
    config.update(overrides)
    return yaml.safe_dump(config)


class Process:
    """One allocation's rank-0 process, played step by step."""

    def __init__(self, port: int, start: agent_pb2.StartAllocation) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = trial_pb2_grpc.TrialServiceStub(self.channel)
        self.meta = (("x-assay-token", start.token),)
        self.trial_id, self.run_id = start.trial_id, start.run_id
        self.checkpoint_root = start.checkpoint_root  # shared_fs: where checkpoints go

    def next_op(self, total: int = 0) -> trial_pb2.Operation:
        request = trial_pb2.NextOperationRequest(
            trial_id=self.trial_id, run_id=self.run_id, total_batches=total
        )
        op: trial_pb2.Operation = self.stub.NextOperation(request, metadata=self.meta)
        return op

    def validate(self, total: int, value: float) -> str:
        """Report a validation and a checkpoint at `total`, then complete the operation;
        returns the checkpoint's uuid."""
        name = self.report(total, value)
        self.complete(total, value)
        return name

    def report(self, total: int, value: float) -> str:
        ids = {"trial_id": self.trial_id, "run_id": self.run_id}
        report = common_pb2.MetricsReport(total_batches=total, metrics={"loss": value})
        self.stub.ReportMetrics(
            trial_pb2.ReportMetricsRequest(group="validation", reports=[report], **ids),
            metadata=self.meta,
        )
        name = str(uuid.uuid4())
        checkpoint = common_pb2.Checkpoint(
            uuid=name,
            total_batches=total,
            location=str(Path(self.checkpoint_root) / name),
            trial_id=self.trial_id,
            run_id=self.run_id,
        )
        self.stub.ReportCheckpoint(
            trial_pb2.ReportCheckpointRequest(checkpoint=checkpoint, **ids), metadata=self.meta
        )
        return name

    def complete(self, total: int, value: float, *, stop_requested: bool = False) -> None:
        ids: dict[str, Any] = {"trial_id": self.trial_id, "run_id": self.run_id}
        self.stub.CompleteOperation(
            trial_pb2.CompleteOperationRequest(
                total_batches=total, searcher_metric=value, stop_requested=stop_requested, **ids
            ),
            metadata=self.meta,
        )

    def close(self) -> None:
        self.channel.close()


def create_experiment(api: api_pb2_grpc.ApiStub, **overrides: Any) -> int:
    """Create and activate an experiment of `experiment_yaml(**overrides)`; its id."""
    response = api.CreateExperiment(
        api_pb2.CreateExperimentRequest(
            config_yaml=experiment_yaml(**overrides),
            model_definition=model_archive(),
            activate=True,
        )
    )
    return int(response.experiment.id)
