"""Each rank's peak memory and step time, reported in the `system` group with every
training report; the training group keeps only the trial's own metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import assay
from assay._rank_metrics import RankMeter, peak_memory_mb, rank_metrics
from tests.conftest import REGRESSION_DIR, regression_config


def test_rank_metrics_are_named_by_rank() -> None:
    assert rank_metrics([(100.0, 2.5), (120.5, 3.0)]) == {
        "memory_peak_mb/rank_0": 100.0,
        "step_time_ms/rank_0": 2.5,
        "memory_peak_mb/rank_1": 120.5,
        "step_time_ms/rank_1": 3.0,
    }


def test_the_meter_measures_a_window_of_batches() -> None:
    meter = RankMeter(torch.device("cpu"))
    assert meter.sample()[1] == 0.0  # no batch yet: no step time
    for _ in range(4):
        meter.batch_done()
    memory, step = meter.sample()
    assert step > 0.0
    # This process's peak resident memory (torch alone is over 100 MB).
    assert memory == peak_memory_mb(torch.device("cpu")) > 50


def run(tmp_path: Path, slots: int) -> assay.LocalResult:
    return assay.run_local(
        config=regression_config(batches=8, scheduling_unit=4, slots=slots),
        model_dir=REGRESSION_DIR,
        checkpoint_dir=tmp_path / "ckpt",
    )


def test_a_run_reports_the_system_group_beside_training(tmp_path: Path) -> None:
    result = run(tmp_path, slots=1)
    assert [r["total_batches"] for r in result.system_history] == [4, 8]
    for report in result.system_history:
        assert set(report["metrics"]) == {"memory_peak_mb/rank_0", "step_time_ms/rank_0"}
        assert all(v > 0 for v in report["metrics"].values())
    assert all("memory_peak_mb/rank_0" not in r["metrics"] for r in result.training_history)


@pytest.mark.slow
def test_two_slots_report_both_ranks(tmp_path: Path) -> None:
    result = run(tmp_path, slots=2)
    names = set(result.system_history[-1]["metrics"])
    assert names == {f"{m}/rank_{r}" for m in ("memory_peak_mb", "step_time_ms") for r in (0, 1)}
