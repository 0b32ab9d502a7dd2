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
