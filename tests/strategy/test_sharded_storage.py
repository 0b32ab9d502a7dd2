"""A sharded checkpoint stored by 2 real FSDP processes through the Core API
(`store_path(shard=True)` + `save_sharded` on shared_fs, `core.checkpoint.save_sharded` on
S3 from moto's server), restored by them (`core.checkpoint.load_sharded`) and in one
process, and deleted whole by the master's garbage collection.

Every rank writes and (on S3) uploads its own shards; the chief writes `shards.json` and
`metadata.json`, the manifest, last. This file is also the worker: `python FILE JSON`.
"""

from __future__ import annotations

import json
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
from tests.strategy.test_sharded import _build, _equal, _full, _load, _train, launch

if TYPE_CHECKING:
    from assay.master.store import CheckpointRecord
    from tests.conftest import S3Server


def _worker(args: dict[str, Any]) -> None:
    import torch.distributed as dist

    from assay.core._backend import LocalBackend
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
    dist.barrier()
    dist.destroy_process_group()


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

    from assay.master._gc import delete_checkpoint

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
    launch(
        "store",
        2,
        script=__file__,
        bucket=bucket,
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

    from assay.master._gc import delete_checkpoint

    store = _States()
    record = _record(uuid, storage.location(uuid), read_metadata(local).files)
    delete_checkpoint(store, record, storage)  # type: ignore[arg-type]
    assert s3_server.keys(bucket) == []
    assert not storage.exists(uuid)
    assert store.states == {uuid: "DELETED"}


if __name__ == "__main__":
    _worker(json.loads(sys.argv[2]))
