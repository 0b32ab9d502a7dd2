"""Core API scripts reach strategies through `core.setup(model, optimizer)`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import assay

SCRIPTS = Path(__file__).parent / "scripts"


def reference(steps: int, clip: float) -> dict[str, torch.Tensor]:
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
    y = x.sum(1, keepdim=True)
    for _ in range(steps):
        nn.functional.mse_loss(model(x), y).backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model.state_dict()


def config(out: Path, strategy: str, slots: int) -> dict[str, Any]:
    return {
        "entrypoint": "python3 fsdp_setup.py",
        "hyperparameters": {"steps": 10, "clip": 0.5, "out": str(out)},
        "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 10}},
        "resources": {"slots_per_trial": slots},
        "optimizations": {"strategy": strategy},
    }


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "slots"), [("fsdp", 2), ("ddp", 2), ("fsdp", 1)])
def test_setup_distributes_as_the_config_says(tmp_path: Path, strategy: str, slots: int) -> None:
    out = tmp_path / "weights.pt"
    result = assay.run_local(
        config=config(out, strategy, slots), model_dir=SCRIPTS, checkpoint_dir=tmp_path / "c"
    )
    assert result.total_batches == 10
    expected = reference(10, 0.5)
    got = torch.load(out, weights_only=True)
    assert got.keys() == expected.keys()
    assert max(float((got[k] - expected[k]).abs().max()) for k in got) <= 1e-5
