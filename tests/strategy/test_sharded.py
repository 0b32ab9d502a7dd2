"""Sharded checkpoints (`assay.strategy._sharded`) against ground truth, on CPU with gloo.

One module fixture trains a `fully_shard`ed MLP with Adam on 2 real processes for K steps,
saves it sharded, gathers the full state dict as the reference, then trains M more steps
(the straight run). Restores on 1, 2 and 4 ranks (FSDP), on 2 ranks of DDP and on one
plain process continue M steps; each is compared, bit for bit (fp32), with the same world
continuing from the gathered reference state, and the 2-rank restore with the straight run.

The same processes also train the regression Trial under `optimizations.strategy: fsdp`
(the Trial API), whose checkpoints are sharded: saved on 2 ranks, it is restored on 4,
saved, restored on 2, saved and restored on 1 slot (no FSDP); each hop continues bit for
bit as its twin does, the same checkpoint's state restored from full state dicts.

This file is also the worker those processes run: `python test_sharded.py PHASE JSON`.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch

if TYPE_CHECKING:
    from assay.proto import common_pb2
    from tests.cli.conftest import FakeApi
if __name__ != "__main__":  # not in the worker processes
    from tests.cli.conftest import master  # noqa: F401  (the fake master's fixture)

K_STEPS = 3
M_STEPS = 3
GLOBAL_BATCH = 8


# --- the worker ---------------------------------------------------------------------------


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 4),
    )


def _wrap(model: torch.nn.Module, strategy: str, world: int) -> torch.nn.Module:
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model.children():
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        return model
    if strategy == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    return model


def _batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL_BATCH, 8, generator=generator)
    y = torch.randn(GLOBAL_BATCH, 4, generator=generator)
    return x[rank::world], y[rank::world]


def _train(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, start: int, steps: int
) -> None:
    import torch.distributed as dist

    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    for step in range(start, start + steps):
        x, y = _batch(step, rank, world)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()


def _build(strategy: str, world: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = _wrap(_model(), strategy, world)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def _full(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    # A copy: some entries (Adam's `step`) are the optimizer's live tensors.
    state: dict[str, Any] = _clone({"model": model_state, "optimizer": optim_state})
    return state


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_clone(v) for v in value)
    return value


def _load_full(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: Path) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    state = torch.load(path, weights_only=True)
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
        options=StateDictOptions(full_state_dict=True),
    )


def _worker(phase: str, args: dict[str, Any]) -> None:
    import torch.distributed as dist

    from assay._ranks import release_groups_at_exit
    from assay.strategy._sharded import save_sharded

    world = int(os.environ.get("WORLD_SIZE", "1"))
    strategy = args.get("strategy", "")
    if strategy != "single":
        dist.init_process_group("gloo")
        release_groups_at_exit()  # as `assay.core` does for a script's ranks
    rank = dist.get_rank() if dist.is_initialized() else 0
    out = Path(args["out"])
    if phase == "first":
        model, optimizer = _build(strategy, world)
        _train(model, optimizer, 0, K_STEPS)
        save_sharded(
            Path(args["ckpt"]), model, optimizer, rank=rank, world_size=world, strategy=strategy
        )
        reference = _full(model, optimizer)
        _train(model, optimizer, K_STEPS, M_STEPS)
        straight = _full(model, optimizer)
        if rank == 0:
            torch.save(reference, out / "reference.pt")
            torch.save(straight, out / "straight.pt")
        _trials(args["trials"], out)
    elif phase == "restore":
        for each in args["strategies"]:
            _restore(each, world, rank, Path(args["ckpt"]), out)
        _trials(args.get("trials", []), out)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _restore(strategy: str, world: int, rank: int, ckpt: Path, out: Path) -> None:
    """Restore `ckpt` and continue; beside it, continue from the gathered reference."""
    from assay.strategy._sharded import load_sharded

    model, optimizer = _build(strategy, world)
    load_sharded(ckpt, model, optimizer)
    loaded = _full(model, optimizer)
    _train(model, optimizer, K_STEPS, M_STEPS)
    restored = _full(model, optimizer)
    twin, twin_optimizer = _build(strategy, world)
    _load_full(twin, twin_optimizer, out / "reference.pt")
    _train(twin, twin_optimizer, K_STEPS, M_STEPS)
    continued = _full(twin, twin_optimizer)
    if rank == 0:
        name = f"{strategy}{world}"
        torch.save(loaded, out / f"loaded-{name}.pt")
        torch.save(restored, out / f"restored-{name}.pt")
        torch.save(continued, out / f"continued-{name}.pt")


def _trials(runs: list[dict[str, Any]], out: Path) -> None:
    import torch.distributed as dist

    """Train the regression Trial once per run (in this process group); rank 0 writes the
    path of each run's last checkpoint into `out/<name>`, or the error it expected."""
    from assay._worker import run_worker
    from assay.common.spec import WorkerSpec
    from assay.errors import AssayError

    for run in runs:
        spec = WorkerSpec(
            config=run["config"],
            model_dir=str(_REGRESSION),
            checkpoint_dir=run["checkpoint_dir"],
            resume_from=run.get("resume_from"),
        )
        if run.get("expect_error"):
            try:
                run_worker(spec, env=None)
            except AssayError as e:
                if dist.get_rank() == 0:
                    (out / run["name"]).write_text(f"{type(e).__name__}: {e}")
            continue
        result = run_worker(spec, env=None)
        if result is not None:
            assert result.checkpoint is not None
            (out / run["name"]).write_text(result.checkpoint)


_REGRESSION = Path(__file__).resolve().parents[1] / "fixtures" / "regression"
T_HOP = 4  # batches each hop of the Trial's chain trains


def trial_config(slots: int, batches: int) -> dict[str, Any]:
    """The regression Trial under FSDP: 3 global batches an epoch (shuffled), its LR
    stepped every batch, a checkpoint every `T_HOP` batches."""
    return {
        "name": "sharded-trial",
        "entrypoint": "model_def:RegressionTrial",
        "hyperparameters": {
            "global_batch_size": 16,
            "lr": 0.05,
            "n_train": 48,
            "shuffle": True,
            "scheduler": "batch",
        },
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": batches}},
        "resources": {"slots_per_trial": slots},
        "optimizations": {"strategy": "fsdp", "fsdp": {"wrap": ["Linear"]}},
        "min_checkpoint_period": {"batches": T_HOP},
        "scheduling_unit": T_HOP,
        "reproducibility": {"experiment_seed": 3},
    }


# --- launching ----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(phase: str, world: int, *, script: str = __file__, **args: Any) -> None:
    """`world` processes of `script`'s worker (this file's), as torchrun starts them."""
    port = _free_port()
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        command = [sys.executable, script, phase, json.dumps(args, default=str)]
        procs.append(subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True))
    failures = []
    for rank, proc in enumerate(procs):
        _, err = proc.communicate(timeout=240)
        if proc.returncode != 0:
            failures.append(f"rank {rank} exited {proc.returncode}:\n{err[-3000:]}")
    assert not failures, "\n".join(failures)


def _equal(a: Any, b: Any, where: str = "") -> None:
    """`a` and `b` hold the same values, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype, where
        assert torch.equal(a, b), f"{where} differs"
    elif isinstance(a, dict):
        assert isinstance(b, dict), where
        assert a.keys() == b.keys(), f"{where}: {a.keys()} vs {b.keys()}"
        for key in a:
            _equal(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def _load(path: Path) -> Any:
    return torch.load(path, weights_only=True)


# --- tests --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 FSDP ranks: K steps, saved sharded into `ckpt`, gathered, M more steps."""
    out = tmp_path_factory.mktemp("sharded")
    # The Trial: 2 x T_HOP batches straight on 2 ranks (checkpoints at T_HOP and 2 T_HOP).
    straight = {
        "name": "trial-straight",
        "config": trial_config(2, 2 * T_HOP),
        "checkpoint_dir": str(out / "trial-2"),
    }
    # A searcher length that ends in the middle of an accumulation of 2.
    accumulating = trial_config(2, 5)
    accumulating["optimizations"] = {"strategy": "fsdp", "aggregation_frequency": 2}
    mid = {
        "name": "trial-mid-accumulation",
        "config": accumulating,
        "checkpoint_dir": str(out / "trial-mid"),
        "expect_error": True,
    }
    launch("first", 2, strategy="fsdp", ckpt=out / "ckpt", out=out, trials=[straight, mid])
    return out


def test_manifest_lists_every_file_with_its_sha256(first: Path) -> None:
    from assay.strategy._sharded import SHARD_MANIFEST, is_sharded

    ckpt = first / "ckpt"
    manifest = json.loads((ckpt / SHARD_MANIFEST).read_text())

    assert is_sharded(ckpt)
    assert manifest["world_size"] == 2
    assert manifest["strategy"] == "fsdp"
    assert manifest["contents"] == ["model", "optimizer"]
    on_disk = {p.name for p in ckpt.iterdir()} - {SHARD_MANIFEST}
    assert set(manifest["files"]) == on_disk
    assert {".metadata", "__0_0.distcp", "__1_0.distcp"} <= on_disk
    for name, entry in manifest["files"].items():
        data = (ckpt / name).read_bytes()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_to_full_state_dict_equals_the_gathered_state_dict(first: Path) -> None:
    from assay.strategy._sharded import to_full_state_dict

    full = to_full_state_dict(first / "ckpt")

    _equal(full, _load(first / "reference.pt"))


@pytest.fixture(scope="module")
def on_four(first: Path) -> Path:
    """4 ranks: the sharded checkpoint restored under FSDP (M steps on), beside its twin
    from the gathered state; and the Trial's checkpoint taken on 2 ranks continued on 4
    (`on-4`), beside its twin restored from the same state as full state dicts."""
    saved = _trial_checkpoints(first / "trial-2")[T_HOP]
    launch(
        "restore",
        4,
        strategies=["fsdp"],
        ckpt=first / "ckpt",
        out=first,
        trials=[
            _hop("on-4", 4, 2 * T_HOP, saved, first),
            _hop("twin-4", 4, 2 * T_HOP, _as_full_checkpoint(saved, first), first),
        ],
    )
    return first


@pytest.fixture(scope="module")
def on_two(on_four: Path) -> Path:
    """2 ranks: the sharded checkpoint restored under FSDP and under DDP; the Trial's
    checkpoint from 4 ranks continued on 2 (`on-2`) beside its twin, and the Trial's first
    checkpoint again on 2 (`again-2`), to compare with the straight run."""
    first = on_four
    on_4 = Path((first / "on-4").read_text())
    saved = _trial_checkpoints(first / "trial-2")[T_HOP]
    launch(
        "restore",
        2,
        strategies=["fsdp", "ddp"],
        ckpt=first / "ckpt",
        out=first,
        trials=[
            _hop("on-2", 2, 3 * T_HOP, on_4, first),
            _hop("twin-2", 2, 3 * T_HOP, _as_full_checkpoint(on_4, first), first),
            _hop("again-2", 2, 2 * T_HOP, saved, first),
        ],
    )
    return first


@pytest.mark.slow
@pytest.mark.parametrize(
    ("world", "strategies"),
    [(1, ["fsdp"]), (2, ["fsdp", "ddp"]), (4, ["fsdp"])],
    ids=["fsdp-on-1", "fsdp-and-ddp-on-2", "fsdp-on-4"],
)
def test_restored_on_another_world_continues_bit_identically(
    first: Path, world: int, strategies: list[str], request: pytest.FixtureRequest
) -> None:
    if world == 1:
        launch("restore", world, strategies=strategies, ckpt=first / "ckpt", out=first)
    else:  # the module's launches on 2 and 4 ranks, which also continue the Trial's chain
        request.getfixturevalue({2: "on_two", 4: "on_four"}[world])

    for strategy in strategies:
        name = f"{strategy}{world}"
        _equal(_load(first / f"loaded-{name}.pt"), _load(first / "reference.pt"))
        _equal(_load(first / f"restored-{name}.pt"), _load(first / f"continued-{name}.pt"))
    if world == 2:  # the same world: the restore continues as the straight run did
        _equal(_load(first / "restored-fsdp2.pt"), _load(first / "straight.pt"))


def test_restored_into_one_plain_process_without_a_process_group(first: Path) -> None:
    from assay.strategy._sharded import load_sharded

    model, optimizer = _build("single", 1)
    load_sharded(first / "ckpt", model, optimizer)
    _equal(_full(model, optimizer), _load(first / "reference.pt"))
    _train(model, optimizer, K_STEPS, M_STEPS)

    twin, twin_optimizer = _build("single", 1)
    _load_full(twin, twin_optimizer, first / "reference.pt")
    _train(twin, twin_optimizer, K_STEPS, M_STEPS)
    _equal(_full(model, optimizer), _full(twin, twin_optimizer))


def test_model_alone_loads_without_its_optimizer(first: Path) -> None:
    from assay.strategy._sharded import load_sharded

    model = _model()
    load_sharded(first / "ckpt", model, None)

    _equal(model.state_dict(), _load(first / "reference.pt")["model"])


def _copy(first: Path, tmp_path: Path) -> Path:
    target = tmp_path / "ckpt"
    shutil.copytree(first / "ckpt", target)
    return target


def test_a_corrupted_shard_is_refused(first: Path, tmp_path: Path) -> None:
    from assay._checkpoint import CheckpointError
    from assay.strategy._sharded import load_sharded, to_full_state_dict

    ckpt = _copy(first, tmp_path)
    shard = ckpt / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))

    model, optimizer = _build("single", 1)
    with pytest.raises(CheckpointError, match=r"__1_0.distcp fails its sha256"):
        load_sharded(ckpt, model, optimizer)
    with pytest.raises(CheckpointError, match=r"__1_0.distcp fails its sha256"):
        to_full_state_dict(ckpt)


def test_a_missing_shard_and_a_missing_manifest_are_refused(first: Path, tmp_path: Path) -> None:
    from assay._checkpoint import CheckpointError
    from assay.strategy._sharded import SHARD_MANIFEST, is_sharded, load_sharded

    ckpt = _copy(first, tmp_path)
    (ckpt / "__0_0.distcp").unlink()
    with pytest.raises(CheckpointError, match="incomplete: __0_0.distcp is missing"):
        load_sharded(ckpt, _model(), None)

    (ckpt / SHARD_MANIFEST).unlink()
    assert not is_sharded(ckpt)
    with pytest.raises(
        CheckpointError, match=f"not a sharded checkpoint: it has no {SHARD_MANIFEST}"
    ):
        load_sharded(ckpt, _model(), None)


def test_metadata_that_would_run_code_is_refused_even_with_a_matching_sha256(
    first: Path, tmp_path: Path
) -> None:
    from assay._checkpoint import CheckpointError
    from assay.strategy._sharded import SHARD_MANIFEST, to_full_state_dict

    ckpt = _copy(first, tmp_path)
    evil = pickle.dumps(_Evil())
    (ckpt / ".metadata").write_bytes(evil)
    manifest = json.loads((ckpt / SHARD_MANIFEST).read_text())
    manifest["files"][".metadata"] = {
        "size": len(evil),
        "sha256": hashlib.sha256(evil).hexdigest(),
    }
    (ckpt / SHARD_MANIFEST).write_text(json.dumps(manifest))

    with pytest.raises(CheckpointError, match=r"refers to posix.system|refers to os.system"):
        to_full_state_dict(ckpt)
    assert not (tmp_path / "pwned").exists()


class _Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("touch pwned",))


def test_a_model_of_another_shape_is_refused_with_the_reason(first: Path) -> None:
    from assay._checkpoint import CheckpointError
    from assay.strategy._sharded import load_sharded

    other = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    with pytest.raises(CheckpointError, match="does not fit this model"):
        load_sharded(first / "ckpt", other, None)


def test_one_plain_process_saves_a_model_alone_and_refuses_to_load_an_optimizer(
    tmp_path: Path,
) -> None:
    from assay._checkpoint import CheckpointError
    from assay.strategy._sharded import load_sharded, read_shard_manifest, save_sharded

    model = _model()
    save_sharded(tmp_path, model, None, rank=0, world_size=1, strategy="single")
    manifest = read_shard_manifest(tmp_path)
    assert (manifest["world_size"], manifest["contents"]) == (1, ["model"])

    fresh, optimizer = _build("single", 1)
    with pytest.raises(CheckpointError, match="holds no optimizer state; load it without"):
        load_sharded(tmp_path, fresh, optimizer)
    with torch.no_grad():
        for parameter in fresh.parameters():
            parameter.add_(1.0)
    load_sharded(tmp_path, fresh, None)
    _equal(fresh.state_dict(), model.state_dict())
    with pytest.raises(CheckpointError, match="already holds a sharded checkpoint"):
        save_sharded(tmp_path, model, None, rank=0, world_size=1, strategy="single")


def test_save_refuses_a_rank_that_is_not_the_process_groups(tmp_path: Path) -> None:
    from assay.strategy._sharded import save_sharded

    with pytest.raises(ValueError, match="does not match the process group"):
        save_sharded(tmp_path, _model(), None, rank=1, world_size=2, strategy="fsdp")
    assert list(tmp_path.iterdir()) == []


# --- the Trial API under FSDP: sharded checkpoints that reshard 2 -> 4 -> 2 -> 1 -------------


def _trial_checkpoints(root: Path) -> dict[int, Path]:
    """The checkpoints under `root` by the batch they were taken at."""
    from assay._checkpoint import read_metadata

    found = {}
    for path in root.iterdir():
        if (path / "metadata.json").is_file():
            found[read_metadata(path).total_batches] = path
    return found


def _check_sharded(ckpt: Path, world: int) -> dict[str, int]:
    """`ckpt` holds the model and optimizer as `world` ranks' shards, each file listed in
    `metadata.json` and `shards.json` with its sha256; returns the shards' sizes by rank."""
    from assay._checkpoint import verify_checkpoint
    from assay.strategy._sharded import SHARD_MANIFEST

    metadata = verify_checkpoint(ckpt)
    assert (metadata.strategy, metadata.world_size) == ("fsdp", world)
    assert "models.pt" not in metadata.files
    assert "optimizers.pt" not in metadata.files
    shards = json.loads((ckpt / "model-000" / SHARD_MANIFEST).read_text())
    assert (shards["world_size"], shards["contents"]) == (world, ["model", "optimizer"])
    per_rank = {f"__{rank}_0.distcp" for rank in range(world)}
    assert set(shards["files"]) == per_rank | {".metadata"}
    for name, entry in shards["files"].items():
        listed = metadata.files[f"model-000/{name}"]
        data = (ckpt / "model-000" / name).read_bytes()
        assert (listed.size, listed.sha256) == (entry["size"], entry["sha256"])
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
    return {name: int(shards["files"][name]["size"]) for name in sorted(per_rank)}


def _trial_state(ckpt: Path) -> dict[str, Any]:
    """Everything a Trial's checkpoint restores, with full model and optimizer states."""
    from assay._checkpoint import load_file, load_user_state
    from assay.strategy._sharded import to_full_state_dict

    state = {stem: load_file(ckpt, stem) for stem in ("lr_schedulers", "rng", "trial_state")}
    state["seen"] = load_user_state(ckpt)["seen"]  # the Trial's own state (its pid aside)
    if (ckpt / "models.pt").is_file():
        state["models"] = load_file(ckpt, "models")
        state["optimizers"] = load_file(ckpt, "optimizers")
    else:
        full = to_full_state_dict(ckpt / "model-000")
        state["models"], state["optimizers"] = [full["model"]], [full["optimizer"]]
    return state


def _as_full_checkpoint(ckpt: Path, root: Path) -> Path:
    """A copy of sharded Trial checkpoint `ckpt` under `root` with full state dicts
    (`models.pt`, `optimizers.pt`) in place of the shards: the twin's starting point."""
    from assay._checkpoint import MANIFEST, new_uuid, read_metadata, seal_checkpoint
    from assay.strategy._sharded import to_full_state_dict

    metadata = read_metadata(ckpt)
    metadata.uuid, metadata.files, metadata.strategy = new_uuid(), {}, ""
    staging = root / f".tmp-{metadata.uuid}"
    shutil.copytree(ckpt, staging, ignore=shutil.ignore_patterns(MANIFEST, "sharded.pt", "model-*"))
    full = to_full_state_dict(ckpt / "model-000")
    torch.save([full["model"]], staging / "models.pt")
    torch.save([full["optimizer"]], staging / "optimizers.pt")
    return seal_checkpoint(staging, root / metadata.uuid, metadata)


def _hop(name: str, slots: int, batches: int, resume_from: Path, out: Path) -> dict[str, Any]:
    return {
        "name": name,
        "config": trial_config(slots, batches),
        "checkpoint_dir": str(out / f"{name}-checkpoints"),
        "resume_from": str(resume_from),
    }


@pytest.mark.slow
def test_a_trial_checkpoint_is_sharded_and_continues_on_4_then_2_then_1_slots(
    on_two: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import assay

    out = on_two
    straight = _trial_checkpoints(out / "trial-2")
    saved = straight[T_HOP]  # taken on 2 ranks, mid-epoch
    sizes = _check_sharded(saved, 2)
    assert Path((out / "trial-straight").read_text()) == straight[2 * T_HOP]

    # On 4 ranks (`on_four`), beside its twin from the same state as full state dicts.
    on_4 = Path((out / "on-4").read_text())
    _check_sharded(on_4, 4)
    _equal(_trial_state(on_4), _trial_state(Path((out / "twin-4").read_text())))

    # Back on 2 ranks; and the first checkpoint again, which continues as the straight run.
    on_2 = Path((out / "on-2").read_text())
    _check_sharded(on_2, 2)
    _equal(_trial_state(on_2), _trial_state(Path((out / "twin-2").read_text())))
    _equal(_trial_state(Path((out / "again-2").read_text())), _trial_state(straight[2 * T_HOP]))

    # On 1 slot: no FSDP, one plain process, full state dicts again.
    ends = [
        assay.run_local(
            config=trial_config(1, 4 * T_HOP),
            model_dir=_REGRESSION,
            checkpoint_dir=out / f"{name}-checkpoints",
            resume_from=start,
        )
        for name, start in (("on-1", on_2), ("twin-1", _as_full_checkpoint(on_2, out)))
    ]
    assert [end.total_batches for end in ends] == [4 * T_HOP] * 2
    assert ends[0].checkpoint is not None
    assert ends[1].checkpoint is not None
    end = _trial_state(Path(ends[0].checkpoint))
    assert end["trial_state"]["total_batches"] == 4 * T_HOP
    # The Trial's own state came through every hop: rank 0's samples, 16 / slots a batch.
    assert end["seen"] == T_HOP * (8 + 4 + 8 + 16)
    _equal(end, _trial_state(Path(ends[1].checkpoint)))
    with capsys.disabled():
        full = sum((saved / "model-000" / n).stat().st_size for n in sizes)
        print(f"\nsharded Trial checkpoint on 2 ranks: {sizes} bytes (all shards {full})")


def test_a_searcher_length_that_ends_mid_accumulation_is_refused_before_training(
    first: Path,
) -> None:
    message = (first / "trial-mid-accumulation").read_text()

    assert message.startswith("TrialContractError: the searcher asks to train to batch 5")
    assert "aggregation_frequency: 2" in message
    assert "multiples of 2" in message
    mid = first / "trial-mid"
    assert not mid.exists() or _trial_checkpoints(mid) == {}  # nothing trained or stored


# --- handing a model on: load_checkpoint, load_trial, checkpoint download --full -----------

UUID = "6f1c2a9e-0000-4000-8000-0000000000fd"


def _stored(first: Path, root: Path, *, sharded_in: str = "") -> common_pb2.Checkpoint:
    """`first`'s sharded checkpoint as checkpoint UUID on shared storage under `root` (in
    subdirectory `sharded_in`, if given), with the record the master keeps of it."""
    from assay._checkpoint import CheckpointMetadata, seal_checkpoint
    from assay.proto import common_pb2

    staging = root / f".tmp-{UUID}"
    shutil.copytree(first / "ckpt", staging / sharded_in)
    metadata = CheckpointMetadata(
        uuid=UUID,
        total_batches=3,
        epoch=0,
        batch_in_epoch=0,
        world_size=2,
        trial_id=11,
        hparams={},
        kind="core",
    )
    final = seal_checkpoint(staging, root / UUID, metadata)
    files = [
        common_pb2.CheckpointFile(name=name, size_bytes=entry.size, sha256=entry.sha256)
        for name, entry in sorted(metadata.files.items())
    ]
    return common_pb2.Checkpoint(
        uuid=UUID,
        trial_id=11,
        experiment_id=7,
        total_batches=3,
        state=common_pb2.CHECKPOINT_STATE_COMPLETED,
        location=str(final),
        files=files,
    )


def _reference(first: Path) -> dict[str, Any]:
    state: dict[str, Any] = torch.load(first / "reference.pt", weights_only=True)
    return state


@pytest.mark.parametrize("sharded_in", ["", "model0"])
def test_load_checkpoint_gives_the_full_model_state_dict(
    first: Path, tmp_path: Path, sharded_in: str
) -> None:
    import assay
    from assay._checkpoint import read_metadata

    _stored(first, tmp_path, sharded_in=sharded_in)

    loaded = assay.load_checkpoint(tmp_path / UUID)
    assert read_metadata(tmp_path / UUID).strategy == "fsdp"  # from shards.json

    assert len(loaded.models) == 1
    _equal(loaded.models[0], _reference(first)["model"])
    model = _model()
    model.load_state_dict(loaded.models[0])  # an unwrapped model, one process


def test_load_trial_builds_the_trial_around_the_gathered_weights(
    first: Path, tmp_path: Path
) -> None:
    import assay

    class OneModelTrial(assay.Trial):
        def __init__(self, context: assay.TrialContext) -> None:
            self.model = context.wrap_model(_model())

        def build_training_data_loader(self) -> Any:
            raise NotImplementedError

        def build_validation_data_loader(self) -> Any:
            raise NotImplementedError

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
            raise NotImplementedError

        def evaluate_batch(self, batch: Any) -> Any:
            raise NotImplementedError

    _stored(first, tmp_path)

    trial = assay.load_checkpoint(tmp_path / UUID).load_trial(OneModelTrial)

    assert isinstance(trial, OneModelTrial)
    _equal(trial.model.state_dict(), _reference(first)["model"])
    assert not trial.model.training


def test_download_full_writes_the_full_state_dict_beside_the_shards(
    first: Path, tmp_path: Path, master: FakeApi
) -> None:
    import assay
    from assay.strategy._sharded import FULL_STATE_DICT
    from tests.cli.conftest import assert_ok, run_cli

    master.responses["GetCheckpoint"] = _stored(first, tmp_path / "storage")
    dest = tmp_path / "out"

    done = run_cli("c", "download", UUID, dest, "--full", master=master, timeout=120)

    assert_ok(done)
    assert f"wrote the full state dict {dest / FULL_STATE_DICT}" in done.stdout
    _equal(torch.load(dest / FULL_STATE_DICT, weights_only=True), _reference(first))
    assert assay.load_checkpoint(dest).uuid == UUID  # still a checkpoint as stored


def test_download_full_of_an_unsharded_checkpoint_is_refused_before_copying(
    tmp_path: Path, master: FakeApi
) -> None:
    from assay.proto import common_pb2
    from tests.cli.conftest import assert_one_line_error, run_cli

    master.responses["GetCheckpoint"] = common_pb2.Checkpoint(
        uuid=UUID,
        experiment_id=7,
        state=common_pb2.CHECKPOINT_STATE_COMPLETED,
        location=str(tmp_path),
        files=[common_pb2.CheckpointFile(name="models.pt", size_bytes=1, sha256="0" * 64)],
    )
    dest = tmp_path / "out"

    done = run_cli("c", "download", UUID, dest, "--full", master=master)

    assert_one_line_error(done, f"checkpoint {UUID} is not sharded", "without --full")
    assert not dest.exists()


if __name__ == "__main__":
    _worker(sys.argv[1], json.loads(sys.argv[2]))
