"""bench/gpu.py's CPU parts run end to end and print the bench JSON last."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "gpu.py"


@pytest.mark.slow
def test_gpu_bench_cpu_parts() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--cpu", "--quick"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["benchmark"] == "gpu"
    assert result["target"] == 2.0
    assert result["cuda"] is False
    assert result["ratio"] > 0
    assert result["nvml"]["slot_type"] == "cpu"
    assert result["precision"]["fp32_tokens_per_s"] > 0
    assert "fp16_tokens_per_s" not in result["precision"]  # a GPU feature
    # FSDP on two ranks holds half of DDP's parameters, gradients and Adam state.
    assert result["fsdp_vs_ddp"]["ranks"] == 2
    assert result["fsdp_vs_ddp"]["state_ratio_fsdp_over_ddp"] <= 0.6
    assert result["harness_overhead"]["weights_ok"] is True


def test_without_a_gpu_it_asks_for_cpu() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2
    assert "no CUDA device: run with --cpu" in done.stderr
