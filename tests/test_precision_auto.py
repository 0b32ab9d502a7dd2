"""`mixed_precision: auto`: what it picks on each device, that the choice is logged and
shown in the local run's banner, and that a trial trains with it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

import assay
from assay._banner import banner
from assay._precision import make_precision, resolve_precision
from assay.config import parse_config
from tests.conftest import REGRESSION_DIR, regression_config


def test_auto_is_off_on_cpu_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu) == "off"
    with caplog.at_level(logging.INFO, logger="assay"):
        plugin = make_precision("auto", cpu)
    assert plugin.name == "off"
    assert "mixed_precision auto: off on cpu" in caplog.text


@pytest.mark.parametrize("name", ["off", "fp16", "bf16"])
def test_explicit_choices_stand(name: str) -> None:
    assert resolve_precision(name, torch.device("cpu")) == name  # type: ignore[arg-type]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_auto_on_cuda_is_bf16_where_supported_else_fp16() -> None:
    device = torch.device("cuda", 0)
    expected = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    assert make_precision("auto", device).name == expected


def test_config_accepts_auto_and_names_it_in_the_banner() -> None:
    config = parse_config(regression_config(batches=4, precision="auto"))
    assert config.optimizations.mixed_precision == "auto"
    assert "mixed_precision auto" in banner(config, device="cpu")
    plain = parse_config(regression_config(batches=4))
    assert "mixed_precision" not in banner(plain, device="cpu")
    with pytest.raises(assay.errors.InvalidConfigError, match="auto"):
        parse_config(regression_config(batches=4, precision="fp8"))


def test_a_trial_trains_under_auto(tmp_path: Path) -> None:
    result = assay.run_local(
        config=regression_config(batches=4, precision="auto"),
        model_dir=REGRESSION_DIR,
        checkpoint_dir=tmp_path / "ckpt",
    )
    assert result.total_batches == 4
