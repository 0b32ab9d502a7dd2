"""`optimizations.strategy` and `optimizations.fsdp`: what parses and what is refused."""

from __future__ import annotations

from typing import Any

import pytest

from assay.config import parse_config
from assay.errors import InvalidConfigError
from tests.conftest import regression_config


def parse(**optimizations: Any) -> Any:
    config = regression_config(batches=4)
    config["optimizations"].update(optimizations)
    return parse_config(config).optimizations


def problems(**optimizations: Any) -> str:
    with pytest.raises(InvalidConfigError) as raised:
        parse(**optimizations)
    return str(raised.value)


def test_default_is_ddp_with_full_shard_settings() -> None:
    opt = parse()
    assert opt.strategy == "ddp"
    assert opt.fsdp.sharding == "full_shard"
    assert opt.fsdp.wrap == ()
    assert opt.fsdp.min_num_params is None
    assert not opt.fsdp.cpu_offload
    assert opt.fsdp.reshard_after_forward is None


def test_fsdp_block_is_read() -> None:
    opt = parse(
        strategy="fsdp",
        fsdp={
            "sharding": "hybrid_shard",
            "wrap": ["TransformerBlock", "Embedding"],
            "cpu_offload": True,
            "reshard_after_forward": False,
        },
    )
    assert opt.strategy == "fsdp"
    assert opt.fsdp.sharding == "hybrid_shard"
    assert opt.fsdp.wrap == ("TransformerBlock", "Embedding")
    assert opt.fsdp.cpu_offload
    assert opt.fsdp.reshard_after_forward is False
    assert parse(strategy="fsdp", fsdp={"min_num_params": 1000}).fsdp.min_num_params == 1000


@pytest.mark.parametrize(
    ("optimizations", "message"),
    [
        ({"strategy": "deepspeed"}, "optimizations.strategy: expected one of ddp | fsdp"),
        ({"fsdp": {"wrap": ["Block"]}}, "optimizations.fsdp: applies to strategy: fsdp"),
        (
            {"strategy": "fsdp", "fsdp": {"sharding": "zero3"}},
            "optimizations.fsdp.sharding: expected one of full_shard | shard_grad_op | "
            "hybrid_shard, got 'zero3'",
        ),
        (
            {"strategy": "fsdp", "fsdp": {"wrap": "Block"}},
            "optimizations.fsdp.wrap: expected a list of strings",
        ),
        (
            {"strategy": "fsdp", "fsdp": {"wrap": ["nn.Linear"]}},
            "'nn.Linear' is not a Python class name",
        ),
        (
            {"strategy": "fsdp", "fsdp": {"wrap": ["Block"], "min_num_params": 10}},
            "give either wrap (module classes) or min_num_params (a size policy), not both",
        ),
        (
            {"strategy": "fsdp", "fsdp": {"min_num_params": 0}},
            "optimizations.fsdp.min_num_params: must be at least 1",
        ),
        (
            {"strategy": "fsdp", "fsdp": {"cpu_offload": "yes"}},
            "optimizations.fsdp.cpu_offload: expected true or false",
        ),
        (
            {"strategy": "fsdp", "fsdp": {"shard": "full"}},
            "optimizations.fsdp.shard: unknown key; did you mean 'sharding'?",
        ),
    ],
)
def test_bad_values_are_refused_with_the_key_and_the_rule(
    optimizations: dict[str, Any], message: str
) -> None:
    assert message in problems(**optimizations)
