"""The digits example reaches its accuracy bar with every shipped config."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "digits"


@pytest.mark.slow
@pytest.mark.parametrize("config", ["const.yaml", "distributed.yaml", "accumulation_bf16.yaml"])
def test_digits_reaches_95_percent(tmp_path: Path, config: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "assay.cli.main",
            "trial",
            "run-local",
            str(EXAMPLE / config),
            str(EXAMPLE),
            "--checkpoint-dir",
            str(tmp_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["validation_metrics"]["accuracy"] >= 0.95
    assert Path(result["checkpoint"]).is_dir()


@pytest.mark.parametrize("config", sorted(p.name for p in EXAMPLE.glob("*.yaml")))
def test_every_example_config_is_valid_and_its_search_plan_resolves(config: str) -> None:
    from assay.config import load_config, preview

    parsed = load_config(EXAMPLE / config)
    plan = preview(parsed.searcher, parsed.hyperparameters)
    assert plan.total_trials >= 1


def test_the_search_examples_have_the_rungs_their_comments_promise() -> None:
    from assay.config import load_config, preview

    def rungs(config: str) -> list[list[tuple[int, int]]]:
        parsed = load_config(EXAMPLE / config)
        plan = preview(parsed.searcher, parsed.hyperparameters)
        return [[(r.length, r.trials) for r in b.rungs] for b in plan.brackets]

    assert rungs("adaptive_asha.yaml") == [[(64, 8), (256, 2)]]
    assert rungs("asha_tpe.yaml") == [[(16, 16), (64, 4), (256, 1)]]
