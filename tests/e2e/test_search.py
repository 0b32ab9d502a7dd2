"""End to end: an adaptive ASHA search of the digits example on a real master and agents.

Two agents with one CPU slot each run `examples/digits/adaptive_asha.yaml` (2 trials at a
time, rungs from `assay preview-search`), made smaller to keep CI short: 4 trials of at most
128 batches, so the same plan of a bottom rung (32) and a top rung (128) that the best
quarter reaches (tests/test_example.py checks the example's own plan). Trials that are not
promoted stop at the bottom rung; a promoted trial resumes from its rung checkpoint and
continues, so its validations sit exactly at the rungs it reached and it never restarts.
SQLite only, to keep CI short.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import ROOT, Cluster, start_cluster, stop_cluster

EXAMPLE = "examples/digits"
CONFIG = f"{EXAMPLE}/adaptive_asha.yaml"
MAX_LENGTH = 128  # the example's 256, halved: rungs at 32 and 128 batches
MAX_TRIALS = 4  # the example's 8, halved: one of them promoted
WAIT_S = 480


@pytest.fixture(scope="module")
def search_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("search"), None, agents=2, slots=1)
    try:
        yield c
    finally:
        stop_cluster(c)


def _config(tmp: Path) -> str:
    config = yaml.safe_load((ROOT / CONFIG).read_text())
    config["searcher"]["max_length"] = {"batches": MAX_LENGTH}
    config["searcher"]["max_trials"] = MAX_TRIALS
    path = tmp / "adaptive_asha.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def _rungs(cluster: Cluster, config: str) -> list[int]:
    plan = cluster.json("preview-search", config)
    [bracket] = plan["brackets"]  # mode aggressive: one bracket
    return [rung["length"] for rung in bracket["rungs"]]


def _batches(rows: list[dict[str, Any]]) -> list[int]:
    return [int(row["total_batches"]) for row in rows]


@pytest.mark.slow
def test_adaptive_asha_stops_most_trials_early_and_continues_the_promoted(
    search_cluster: Cluster, tmp_path: Path
) -> None:
    cluster = search_cluster
    config = _config(tmp_path)
    rungs = _rungs(cluster, config)
    assert len(rungs) >= 2, rungs
    bottom, top = rungs[0], rungs[-1]
    assert top == MAX_LENGTH, rungs

    created = cluster.json("experiment", "create", config, EXAMPLE)
    experiment_id = str(created["id"])
    waited = cluster.cli(
        "experiment", "wait", experiment_id, "--timeout", str(WAIT_S), timeout=WAIT_S + 60
    )
    assert waited.returncode == 0, f"{waited.stdout}\n{waited.stderr}\n{cluster.dump_logs()}"
    described: dict[str, Any] = cluster.json("experiment", "describe", experiment_id)
    assert described["state"] == "COMPLETED", cluster.dump_logs()
    assert described["searcher"] == "adaptive_asha"
    assert described["progress"] == pytest.approx(1.0)
    trials: list[dict[str, Any]] = described["trials"]
    assert len(trials) >= MAX_TRIALS, trials
    assert all(t["state"] == "COMPLETED" for t in trials), trials

    # Most trials are not promoted: they stop at the bottom rung.
    stopped = [t for t in trials if t["total_batches"] == bottom]
    assert len(stopped) > len(trials) / 2, [t["total_batches"] for t in trials]
    for trial in trials:
        assert trial["total_batches"] in rungs, trial
        assert trial["restarts"] == 0, trial  # a pause is not a failure

    # Promoted trials resumed from their rung checkpoint: one validation per rung reached,
    # training metrics continue past the rung instead of starting over.
    promoted = [t for t in trials if t["total_batches"] > bottom]
    assert promoted, [t["total_batches"] for t in trials]
    assert any(t["total_batches"] == top for t in promoted)
    for trial in promoted:
        reached = [r for r in rungs if r <= trial["total_batches"]]
        trial_id = str(trial["id"])
        validation = cluster.json("trial", "metrics", trial_id, "--group", "validation")
        assert _batches(validation) == reached, validation
        assert all("accuracy" in row["metrics"] for row in validation)
        training = _batches(cluster.json("trial", "metrics", trial_id, "--group", "training"))
        assert training == sorted(set(training)), training  # no batch trained twice
        assert training[-1] == trial["total_batches"]
        assert trial["latest_checkpoint"]
    for trial in stopped:
        validation = cluster.json("trial", "metrics", str(trial["id"]), "--group", "validation")
        assert _batches(validation) == [bottom], validation

    # The experiment's best trial is the one with the highest accuracy (smaller_is_better
    # is false).
    best = max(t["best_validation"] for t in trials)
    best_trial = described["best_trial"]
    assert best_trial is not None
    assert best_trial["best_validation"] == pytest.approx(best)
    assert best_trial["id"] in {t["id"] for t in trials if t["best_validation"] == best}
