"""The metadata a script stores a checkpoint with reaches the master's record and comes
back in `GetCheckpoint`/`ListCheckpoints` (what `assay checkpoint describe` shows): the
chief's report as `ClusterBackend` builds it, the master's reading of it, the stored
record, and the message the CLI formats."""

from __future__ import annotations

import math
from typing import Any

from assay._backend import ClusterBackend
from assay._checkpoint import CheckpointMetadata
from assay.cli import _format as fmt
from assay.common.spec import ClusterSpec
from assay.master import wire
from assay.master.checkpoints import reported_metadata
from assay.master.store import CheckpointRecord
from assay.proto import common_pb2, trial_pb2

UUID = "0f2c8a3e-1111-4222-8333-944455556666"


class _Client:
    """Takes the chief's report as the master would receive it."""

    def __init__(self) -> None:
        self.sent: list[trial_pb2.ReportCheckpointRequest] = []

    def report_checkpoint(self, request: trial_pb2.ReportCheckpointRequest) -> None:
        self.sent.append(request)


def _reported(user_metadata: dict[str, Any]) -> common_pb2.Checkpoint:
    spec = ClusterSpec(
        config={},
        hparams={},
        trial_seed=0,
        trial_id=3,
        run_id=1,
        experiment_id=2,
        allocation_id="a",
        checkpoint_root="/ckpt",
        restore_from=None,
        trial_api="127.0.0.1:1",
        token="t",
    )
    client = _Client()
    backend = ClusterBackend(spec, client=client)  # type: ignore[arg-type]
    metadata = CheckpointMetadata(
        uuid=UUID,
        total_batches=5,
        epoch=0,
        batch_in_epoch=0,
        world_size=1,
        trial_id=3,
        hparams={},
        user_metadata=user_metadata,
        kind="core",
    )
    backend.report_checkpoint(metadata, f"/ckpt/2/{UUID}")
    [request] = client.sent
    return request.checkpoint


def _record(metadata: Any) -> CheckpointRecord:
    return CheckpointRecord(
        uuid=UUID,
        trial_id=3,
        run_id=1,
        total_batches=5,
        state="COMPLETED",
        location=f"/ckpt/2/{UUID}",
        files={"state.pt": 10},
        user_metadata={"sha256": {}, "validation_metrics": {}, "metadata": metadata},
    )


def test_a_scripts_metadata_comes_back_as_it_was_stored() -> None:
    stored = reported_metadata(_reported({"note": "up", "steps_completed": 5}))

    assert stored == {"note": "up", "steps_completed": 5}
    shown = fmt.checkpoint_dict(wire.checkpoint(_record(stored), 2))
    assert shown["user_metadata"] == {"note": "up", "steps_completed": 5}


def test_nested_values_keep_their_shape_and_numbers_json_cannot_hold_become_text() -> None:
    stored = reported_metadata(
        _reported(
            {
                "nested": {"lr": 0.25, "sizes": [1, 2.5, None, True]},
                "bad": float("nan"),
                "big": float("inf"),
                "huge": 2**60,
            }
        )
    )

    assert stored == {
        "bad": "nan",
        "big": "inf",
        "huge": float(2**60),  # beyond a double's exact integers: left a float
        "nested": {"lr": 0.25, "sizes": [1, 2.5, None, True]},
    }
    assert not any(isinstance(v, float) and not math.isfinite(v) for v in stored.values())


def test_no_metadata_and_records_from_before_are_shown_as_none() -> None:
    assert reported_metadata(_reported({})) == {}
    old = CheckpointRecord(
        uuid=UUID,
        trial_id=3,
        run_id=1,
        total_batches=5,
        state="COMPLETED",
        location="/x",
        files={},
        user_metadata={"sha256": {}, "validation_metrics": {"vloss": 0.1}},
    )
    assert old.metadata == {}
    assert _record(["not", "a", "dict"]).metadata == {}
    message = wire.checkpoint(old, 2)
    assert fmt.checkpoint_dict(message)["user_metadata"] == {}
    assert dict(message.validation_metrics) == {"vloss": 0.1}
