"""`assay preview-search CONFIG`: the plan of a search as a table or JSON, from the config
file alone (no master, no torch, no Optuna)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from assay.cli.main import cli


def write(tmp_path: Path, searcher: dict[str, Any], **hparams: Any) -> Path:
    path = tmp_path / "config.yaml"
    config = {
        "entrypoint": "model_def:T",
        "hyperparameters": {"global_batch_size": 32, **hparams},
        "searcher": {"metric": "loss", **searcher},
    }
    path.write_text(yaml.safe_dump(config))
    return path


ADAPTIVE = {
    "name": "adaptive_asha",
    "max_trials": 16,
    "max_length": {"batches": 2000},
    "max_concurrent_trials": 4,
}


def test_table(tmp_path: Path) -> None:
    path = write(tmp_path, ADAPTIVE, lr={"type": "log", "minval": -4, "maxval": -1})

    result = CliRunner().invoke(cli, ["preview-search", str(path)])

    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "searcher adaptive_asha; max_length 2000 batches"
    assert lines[1].split() == [
        "BRACKET",
        "RUNG",
        "LENGTH",
        "(batches)",
        "TRIALS",
        "CONCURRENT",
        "BUDGET",
    ]
    assert lines[2].split() == ["0", "0", "125", "12", "2", "2625"]
    assert lines[3].split() == ["1", "500", "3"]
    assert lines[4].split() == ["2", "2000", "0"]
    assert lines[5].split() == ["1", "0", "500", "4", "2", "3500"]
    assert lines[6].split() == ["1", "2000", "1"]
    assert lines[7] == "total: 16 trials, 6125 batches"
    assert "bracket 0 promotes no trial to rung 2" in result.stderr


def test_json(tmp_path: Path) -> None:
    path = write(
        tmp_path, {**ADAPTIVE, "name": "asha", "num_rungs": 3, "max_length": {"batches": 1000}}
    )

    result = CliRunner().invoke(cli, ["preview-search", str(path), "--json"])

    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout.splitlines()[-1])
    assert plan["searcher"] == "asha"
    assert plan["total_trials"] == 16
    assert plan["total_budget"] == 16 * 62 + 4 * 188 + 750
    (bracket,) = plan["brackets"]
    assert bracket["rungs"] == [
        {"length": 62, "trials": 16},
        {"length": 250, "trials": 4},
        {"length": 1000, "trials": 1},
    ]
    assert bracket["max_concurrent_trials"] == 4


def test_grid_counts_points(tmp_path: Path) -> None:
    searcher = {"name": "grid", "max_length": {"batches": 100}}
    path = write(
        tmp_path,
        searcher,
        lr={"type": "log", "minval": -4, "maxval": -1, "count": 4},
        width={"type": "int", "minval": 1, "maxval": 2},
    )

    result = CliRunner().invoke(cli, ["preview-search", str(path), "--json"])

    plan = json.loads(result.stdout)
    assert (plan["sampler"], plan["total_trials"], plan["total_budget"]) == ("grid", 8, 800)
    assert plan["brackets"][0]["max_concurrent_trials"] == 16  # unset: created 16 at a time


@pytest.mark.parametrize(
    ("searcher", "message"),
    [
        ({"name": "random", "max_length": {"batches": 100}}, "searcher.max_trials: is required"),
        (
            {"name": "asha", "max_trials": 8, "divisor": 1, "max_length": {"batches": 100}},
            "searcher.divisor: must be greater than 1",
        ),
    ],
)
def test_invalid_config_is_a_user_error(
    tmp_path: Path, searcher: dict[str, Any], message: str
) -> None:
    result = CliRunner().invoke(cli, ["preview-search", str(write(tmp_path, searcher))])

    assert result.exit_code == 1
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_missing_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["preview-search", str(tmp_path / "nope.yaml")])

    assert result.exit_code == 1
    assert "cannot read config file" in result.stderr


def test_imports_neither_torch_nor_optuna_nor_the_master(tmp_path: Path) -> None:
    path = write(tmp_path, {**ADAPTIVE, "sampler": "tpe"})
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from assay.cli.main import cli\n"
        f"result = CliRunner().invoke(cli, ['preview-search', {str(path)!r}])\n"
        "assert result.exit_code == 0, result.output\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'optuna', 'grpc')\n"
        "         or m.startswith('assay.master')]\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)

    assert done.returncode == 0, done.stderr
