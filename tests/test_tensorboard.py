"""TensorBoard event files kept with a trial's checkpoint storage: uploaded to object
storage with each checkpoint, and read back by `assay trial download-tensorboard`."""

from __future__ import annotations

from pathlib import Path

from assay._cluster import ClusterSession
from assay._trial_client import TrialClient
from assay.common.spec import ClusterSpec
from assay.common.storage import S3Storage, storage_for
from assay.config import parse_config
from tests.conftest import S3Server


def _spec(storage: dict[str, object]) -> ClusterSpec:
    config = {
        "entrypoint": "model_def:T",
        "hyperparameters": {"global_batch_size": 8},
        "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 10}},
        "checkpoint_storage": storage,
    }
    return ClusterSpec.from_dict(
        {
            "config": config,
            "hparams": {},
            "trial_seed": 1,
            "trial_id": 3,
            "run_id": 1,
            "experiment_id": 1,
            "allocation_id": "a",
            "checkpoint_root": "/unused",
            "restore_from": None,
            "trial_api": "127.0.0.1:1",
            "token": "t",
        }
    )


def test_event_files_go_to_object_storage_and_come_back(
    s3_server: S3Server, tmp_path: Path
) -> None:
    bucket = s3_server.new_bucket()
    spec = _spec(s3_server.storage_config(bucket))
    storage = storage_for(parse_config(spec.config).checkpoint_storage)
    local = tmp_path / "out"
    events = local / "tensorboard" / "trial-3"
    events.mkdir(parents=True)
    (events / "events.out.tfevents.1").write_bytes(b"first")
    session = ClusterSession(TrialClient(spec.trial_api, spec.token), spec, storage, local)

    session.sync_tensorboard()
    (events / "events.out.tfevents.1").write_bytes(b"first and more")
    session.close()  # the last sync

    assert s3_server.keys(bucket) == ["runs/tensorboard/trial-3/events.out.tfevents.1"]
    assert isinstance(storage, S3Storage)
    back = tmp_path / "back"
    assert storage.download_tree("tensorboard", "trial-3", back) == 1
    assert (back / "events.out.tfevents.1").read_bytes() == b"first and more"
    assert storage.download_tree("tensorboard", "trial-4", tmp_path / "none") == 0


def test_shared_fs_sessions_upload_nothing(tmp_path: Path) -> None:
    spec = _spec({"type": "shared_fs", "host_path": str(tmp_path)})
    session = ClusterSession(TrialClient(spec.trial_api, spec.token), spec, None, tmp_path)

    session.close()  # written in place already: nothing to do, no error

    assert session.tensorboard is None
