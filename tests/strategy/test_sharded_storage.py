"""A sharded checkpoint stored by 2 real FSDP processes through the Core API
(`store_path(shard=True)` + `save_sharded` on shared_fs, `core.checkpoint.save_sharded` on
S3 from moto's server), restored by them (`core.checkpoint.load_sharded`) and in one
process, and deleted whole by the master's garbage collection.

Every rank writes and (on S3) uploads its own shards; the chief writes `shards.json` and
`metadata.json`, the manifest, last. On S3 the same processes also train the regression
Trial under FSDP (the Trial API), each rank in a local directory of its own as on its own
machine: its sharded checkpoint is uploaded by every rank, reported once by the chief, and
restored from the bucket. This file is also the worker: `python FILE JSON`.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch

if __name__ == "__main__":  # the worker: the repository's tests are importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from assay._checkpoint import MANIFEST, FileEntry, read_metadata, verify_checkpoint
from assay.common.storage import S3Storage, SharedFSStorage
from assay.strategy._sharded import SHARD_MANIFEST, to_full_state_dict
from tests.strategy.test_sharded import (
    _REGRESSION,
    _build,
    _equal,
    _full,
    _load,
    _train,
    launch,
    trial_config,
)

if TYPE_CHECKING:
    from assay.master.store import CheckpointRecord
    from tests.conftest import S3Server


def _worker(args: dict[str, Any]) -> None:
    import torch.distributed as dist

    from assay._backend import LocalBackend
    from assay.core._checkpoint import CheckpointContext
    from assay.core._distributed import DistributedContext
    from assay.strategy._sharded import save_sharded

    dist.init_process_group("gloo")
    distributed = DistributedContext.from_env()
    out = Path(args["out"])
    storage: Any
    if "bucket" in args:
        storage = S3Storage(
            args["bucket"],
            "runs",
            endpoint_url=args["endpoint_url"],
            region="us-east-1",
            access_key="assay-test-key",
            secret_key="assay-test-secret",
        )
    else:
        storage = SharedFSStorage(Path(args["root"]))
    backend = LocalBackend(out / f"metrics{distributed.rank}.jsonl", None)
    checkpoints = CheckpointContext(
        distributed, backend, storage, trial_id=1, hparams={}, steps=lambda: 2
    )
    model, optimizer = _build("fsdp", distributed.size)
    _train(model, optimizer, 0, 2)
    if "bucket" in args:  # the Core API's one call
        uuid = checkpoints.save_sharded(model, optimizer, {"steps_completed": 2})
    else:
        with checkpoints.store_path({"steps_completed": 2}, shard=True) as (path, uuid):
            save_sharded(
                path,
                model,
                optimizer,
                rank=distributed.rank,
                world_size=distributed.size,
                strategy="fsdp",
            )
    full = _full(model, optimizer)
    fresh, fresh_optimizer = _build("fsdp", distributed.size)
    checkpoints.load_sharded(uuid, fresh, fresh_optimizer)  # verified, from storage
    restored = _full(fresh, fresh_optimizer)
    if distributed.is_chief:
        torch.save(full, out / "full.pt")
        torch.save(restored, out / "restored.pt")
        (out / "uuid").write_text(uuid)
    if "trial_bucket" in args:
        _trial_on_s3(args, distributed.rank, out)
    dist.barrier()
    dist.destroy_process_group()


def _returns(session: Any) -> Any:
    """A session factory that gives `session`."""
    return lambda config: session


def _trial_on_s3(args: dict[str, Any], rank: int, out: Path) -> None:
    """The regression Trial under FSDP for 4 batches, its checkpoints stored in S3 as on a
    cluster (each rank in its own local directory; the chief uploads its files and
    reports), then restored from the bucket by both ranks and trained to 6."""
    import torch.distributed as dist

    from assay._session import CheckpointReport, LocalSession
    from assay._worker import run_worker
    from assay.common.spec import WorkerSpec

    storage = S3Storage(
        args["trial_bucket"],
        "trials",
        endpoint_url=args["endpoint_url"],
        region="us-east-1",
        access_key="assay-test-key",
        secret_key="assay-test-secret",
    )

    class Uploading(LocalSession):
        """Rank 0's session: uploads, then reports, as the cluster's session does."""

        def report_checkpoint(self, report: CheckpointReport) -> None:
            storage.upload(report.path, report.metadata.uuid)
            shutil.rmtree(report.path)
            super().report_checkpoint(report)

    local = out / f"rank{rank}"
    reported: list[str] = []
    for batches, resume in ((4, None), (6, "restore")):
        session = Uploading(max_batches=batches, echo=False)
        resume_from = None
        if resume is not None:
            uuid = (out / "trial-uuid").read_text()
            resume_from = local / "restore" / uuid
            storage.download(uuid, resume_from)  # as every rank on a cluster does
        spec = WorkerSpec(
            config=trial_config(2, batches),
            model_dir=str(_REGRESSION),
            checkpoint_dir=str(local / f"to-{batches}"),
            resume_from=None if resume_from is None else str(resume_from),
        )
        run_worker(spec, env=None, session_factory=_returns(session), storage=storage)
        if rank == 0:
            reported += [r.metadata.uuid for r in session.checkpoints]
            (out / "trial-uuid").write_text(reported[-1])
        dist.barrier()
    if rank == 0:
        (out / "trial-reported").write_text(json.dumps(reported))
    left = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
    (out / f"trial-left-{rank}").write_text(json.dumps(left))


class _States:
    """The store's one call that deletion makes, recorded."""

    def __init__(self) -> None:
        self.states: dict[str, str] = {}

    def set_checkpoint_state(self, uuid: str, state: str) -> None:
        self.states[uuid] = state


def _record(uuid: str, location: str, files: dict[str, FileEntry]) -> CheckpointRecord:
    from assay.master.store import CheckpointRecord

    sizes = {name: entry.size for name, entry in files.items()}
    return CheckpointRecord(uuid, 1, 1, 2, "COMPLETED", location, sizes)


def _check_manifest(ckpt: Path) -> None:
    metadata = verify_checkpoint(ckpt)
    shards = json.loads((ckpt / SHARD_MANIFEST).read_text())
    assert set(shards["files"]) | {SHARD_MANIFEST} == set(metadata.files)
    assert {".metadata", "__0_0.distcp", "__1_0.distcp"} <= set(shards["files"])
    assert metadata.world_size == 2
    assert metadata.strategy == "fsdp"


@pytest.mark.slow
def test_shared_fs_stores_restores_and_deletes_a_sharded_checkpoint_whole(
    tmp_path: Path,
) -> None:
    root = tmp_path / "storage"
    launch("store", 2, script=__file__, root=root, out=tmp_path)
    uuid = (tmp_path / "uuid").read_text()
    ckpt = root / uuid

    _check_manifest(ckpt)
    assert sorted(p.name for p in root.iterdir()) == [uuid]  # no staging left behind
    _equal(to_full_state_dict(ckpt), torch.load(tmp_path / "full.pt", weights_only=True))
    _equal(_load(tmp_path / "restored.pt"), _load(tmp_path / "full.pt"))

    from assay.master.checkpoints import delete_checkpoint

    storage = SharedFSStorage(root)
    store = _States()
    record = _record(uuid, storage.location(uuid), read_metadata(ckpt).files)
    delete_checkpoint(store, record, storage)  # type: ignore[arg-type]
    assert list(root.iterdir()) == []
    assert store.states == {uuid: "DELETED"}


@pytest.mark.slow
def test_s3_stores_every_ranks_shards_restores_and_deletes_them_whole(
    tmp_path: Path, s3_server: S3Server
) -> None:
    bucket = s3_server.new_bucket()
    trial_bucket = s3_server.new_bucket()
    launch(
        "store",
        2,
        script=__file__,
        bucket=bucket,
        trial_bucket=trial_bucket,
        endpoint_url=s3_server.endpoint_url,
        out=tmp_path,
    )
    uuid = (tmp_path / "uuid").read_text()
    storage = S3Storage(
        bucket,
        "runs",
        endpoint_url=s3_server.endpoint_url,
        region="us-east-1",
        access_key="assay-test-key",
        secret_key="assay-test-secret",
    )

    keys = s3_server.keys(bucket)
    assert all(key.startswith(f"runs/{uuid}/") for key in keys)
    assert storage.exists(uuid)
    local = tmp_path / "download"
    storage.download(uuid, local)
    _check_manifest(local)
    assert {f"runs/{uuid}/{name}" for name in read_metadata(local).files} | {
        f"runs/{uuid}/{MANIFEST}"
    } == set(keys)
    _equal(to_full_state_dict(local), torch.load(tmp_path / "full.pt", weights_only=True))
    _equal(_load(tmp_path / "restored.pt"), _load(tmp_path / "full.pt"))

    from assay.master.checkpoints import delete_checkpoint

    store = _States()
    record = _record(uuid, storage.location(uuid), read_metadata(local).files)
    delete_checkpoint(store, record, storage)  # type: ignore[arg-type]
    assert s3_server.keys(bucket) == []
    assert not storage.exists(uuid)
    assert store.states == {uuid: "DELETED"}

    _check_trial_on_s3(tmp_path, s3_server, trial_bucket)


def _check_trial_on_s3(out: Path, s3_server: S3Server, bucket: str) -> None:
    """What `_trial_on_s3` stored: two sharded checkpoints (at batches 4 and 6, the second
    after a restore from the bucket), each reported once, with both ranks' shards in the
    bucket and listed in the manifest, and nothing left in the ranks' local directories."""
    from assay._checkpoint import load_file, load_user_state

    storage = S3Storage(
        bucket,
        "trials",
        endpoint_url=s3_server.endpoint_url,
        region="us-east-1",
        access_key="assay-test-key",
        secret_key="assay-test-secret",
    )
    reported = json.loads((out / "trial-reported").read_text())
    assert len(reported) == len(set(reported)) == 2
    expected_keys = set()
    for uuid, batches in zip(reported, (4, 6), strict=True):
        local = out / "trial-download" / uuid
        storage.download(uuid, local)
        metadata = verify_checkpoint(local)
        assert (metadata.total_batches, metadata.strategy, metadata.world_size) == (
            batches,
            "fsdp",
            2,
        )
        shards = json.loads((local / "model-000" / SHARD_MANIFEST).read_text())
        assert set(shards["files"]) == {"__0_0.distcp", "__1_0.distcp", ".metadata"}
        for name, entry in shards["files"].items():
            assert metadata.files[f"model-000/{name}"] == FileEntry(entry["size"], entry["sha256"])
        assert "models.pt" not in metadata.files
        expected_keys |= {f"trials/{uuid}/{name}" for name in [*metadata.files, MANIFEST]}
        # The Trial's own state (rank 0's samples, 8 a batch) came through the restore.
        assert load_user_state(local)["seen"] == 8 * batches
        assert load_file(local, "trial_state")["total_batches"] == batches
    assert set(s3_server.keys(bucket)) == expected_keys
    for rank in (0, 1):  # every rank's staging went once its files were stored
        left = json.loads((out / f"trial-left-{rank}").read_text())
        stored = (".distcp", ".pt", ".json", ".metadata")
        kept = [n for n in left if not n.startswith("restore/") and n.endswith(stored)]
        assert kept == [], kept


if __name__ == "__main__":
    _worker(json.loads(sys.argv[2]))
