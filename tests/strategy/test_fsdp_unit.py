"""`FSDPStrategy` in one process (a 1-rank gloo group): wrapping, optimizers, state dicts."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch import nn

from assay._distributed import DistributedContext
from assay.config._sections import FSDPConfig
from assay.errors import TrainingError
from assay.strategy import DDPStrategy, FSDPStrategy, SingleDeviceStrategy, strategy_for

CPU = torch.device("cpu")


@pytest.fixture(scope="module", autouse=True)
def one_rank_group() -> Iterator[None]:
    from assay._rank_processes import free_port

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(free_port())
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


def fsdp(**config: object) -> FSDPStrategy:
    return FSDPStrategy(DistributedContext(), CPU, FSDPConfig(**config))  # type: ignore[arg-type]


def test_one_process_gets_no_wrapper_and_several_get_the_named_strategy() -> None:
    one = DistributedContext()
    two = DistributedContext(rank=0, size=2, local_size=2)
    assert isinstance(strategy_for("fsdp", one, CPU), SingleDeviceStrategy)
    assert isinstance(strategy_for("fsdp", two, CPU), FSDPStrategy)
    assert isinstance(strategy_for("ddp", two, CPU), DDPStrategy)
    with pytest.raises(TrainingError, match="strategy must be ddp or fsdp, got 'zero'"):
        strategy_for("zero", two, CPU)


def test_a_wrap_class_the_model_lacks_is_named_with_the_classes_it_has() -> None:
    with pytest.raises(TrainingError, match=r"\['Block'\].*Linear, ReLU, Sequential"):
        fsdp(wrap=("Block",)).wrap_model(net())


def test_an_optimizer_built_before_wrapping_is_pointed_at_the_shards() -> None:
    strategy = fsdp(wrap=("Linear",))
    model = net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model = strategy.wrap_model(model)
    strategy.wrap_optimizer(optimizer)
    assert [id(p) for p in optimizer.param_groups[0]["params"]] == [
        id(p) for p in model.parameters()
    ]
    before = [p.full_tensor().clone() for p in model.parameters()]  # type: ignore[attr-defined]
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    after = [p.full_tensor() for p in model.parameters()]  # type: ignore[attr-defined]
    assert all(not torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_an_optimizer_that_stepped_before_wrapping_is_refused() -> None:
    strategy = fsdp()
    model = net()
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    strategy.wrap_model(model)
    with pytest.raises(TrainingError, match="before it has stepped"):
        strategy.wrap_optimizer(optimizer)


def test_an_optimizer_over_an_unwrapped_model_is_refused() -> None:
    strategy = fsdp()
    strategy.wrap_model(net())
    with pytest.raises(TrainingError, match="only step parameters of models wrapped"):
        strategy.wrap_optimizer(torch.optim.SGD(net().parameters(), lr=0.1))


def test_full_state_dicts_round_trip_between_fsdp_and_a_plain_module() -> None:
    strategy = fsdp(min_num_params=10)
    model = strategy.wrap_model(net())
    optimizer = strategy.wrap_optimizer(torch.optim.Adam(model.parameters()))
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    model_state = strategy.model_state_dict(model)
    optim_state = strategy.optimizer_state_dict(optimizer)
    assert set(model_state) == set(net().state_dict())
    assert all(isinstance(k, str) for k in optim_state["state"])  # keyed by name

    # Into a plain module (single strategy): the names become indices.
    single = SingleDeviceStrategy(DistributedContext(), CPU)
    plain = single.wrap_model(net())
    plain_opt = torch.optim.Adam(plain.parameters())
    single.load_model_state_dict(plain, model_state)
    single.load_optimizer_state_dict(plain_opt, optim_state)
    for name, value in plain.state_dict().items():
        assert torch.equal(value, model_state[name])
    assert torch.equal(
        plain_opt.state_dict()["state"][0]["exp_avg"], optim_state["state"]["0.weight"]["exp_avg"]
    )

    # And back: an index-keyed state loads under FSDP.
    again = fsdp()
    model2 = again.wrap_model(net())
    opt2 = again.wrap_optimizer(torch.optim.Adam(model2.parameters()))
    again.load_model_state_dict(model2, plain.state_dict())
    again.load_optimizer_state_dict(opt2, plain_opt.state_dict())
    assert torch.equal(again.model_state_dict(model2)["2.bias"], model_state["2.bias"])
    reloaded = again.optimizer_state_dict(opt2)
    assert torch.equal(
        reloaded["state"]["0.weight"]["exp_avg"], optim_state["state"]["0.weight"]["exp_avg"]
    )


def test_clipping_returns_the_global_norm_as_a_plain_tensor() -> None:
    strategy = fsdp()
    model = strategy.wrap_model(net())
    model(torch.ones(2, 4)).sum().backward()
    reference = net()
    reference(torch.ones(2, 4)).sum().backward()
    expected = torch.nn.utils.clip_grad_norm_(list(reference.parameters()), 0.01)
    norm = strategy.clip_grad_norm(model.parameters(), 0.01)
    assert type(norm) is torch.Tensor
    assert torch.allclose(norm, expected)


def test_a_trial_scaler_is_refused_under_fsdp() -> None:
    from assay import TrialContext
    from assay._precision import make_precision
    from assay.config import parse_config
    from tests.conftest import regression_config

    raw = regression_config(batches=4, slots=2)
    raw["optimizations"]["strategy"] = "fsdp"
    context = TrialContext(
        config=parse_config(raw),
        hparams={"global_batch_size": 16},
        distributed=DistributedContext(rank=0, size=2, local_size=2),
        device=CPU,
        precision=make_precision("off", CPU),
    )
    with pytest.raises(TrainingError, match="use mixed_precision: fp16"):
        context.wrap_scaler(torch.amp.GradScaler("cpu"))


def test_make_strategy_resolves_auto_precision_for_the_device() -> None:
    from assay.config._sections import OptimizationsConfig
    from assay.strategy import make_strategy

    two = DistributedContext(size=2, local_size=2)
    options = OptimizationsConfig(strategy="fsdp", mixed_precision="auto")

    strategy = make_strategy(options, two, CPU)

    assert isinstance(strategy, FSDPStrategy)
    assert strategy.precision == "off"  # what auto means on a CPU


def test_at_exit_a_users_own_mesh_lets_go_of_its_groups() -> None:
    """A script's ranks (`assay.core`'s context over several processes) free, at exit, the
    groups a mesh still holds, as FSDPStrategy's do: left to the interpreter's teardown,
    their Gloo threads could abort a finished rank (exit -6)."""
    from torch.distributed.fsdp import fully_shard

    from assay import _ranks
    from assay.core import _distributed as core_distributed

    core_distributed.DistributedContext(rank=0, size=2)
    assert _ranks._RELEASING  # registered with atexit by a context of 2 ranks

    model = fully_shard(net())  # the default mesh, as a script's own `fully_shard` makes
    mesh = next(iter(model.parameters())).device_mesh  # type: ignore[attr-defined]
    assert mesh._pg_registry, "the mesh holds its group"
    _ranks._release_groups()
    assert mesh._pg_registry == {}
