"""`assay`: the command line. Heavy modules (torch) are imported inside commands only."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click

from assay import __version__
from assay.errors import AssayError

F = TypeVar("F", bound=Callable[..., Any])


def _user_errors(func: F) -> F:
    """Print an AssayError as one line (no traceback) and exit 1."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except AssayError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)

    return wrapper  # type: ignore[return-value]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="assay")
def cli() -> None:
    """Train PyTorch models on your own machines."""


@cli.group()
def trial() -> None:
    """Work with single trials."""


@trial.command("run-local")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("model_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--slots", type=click.IntRange(min=1), help="Override resources.slots_per_trial.")
@click.option(
    "--checkpoint-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where checkpoints go (default: checkpoint_storage.host_path, else ./checkpoints).",
)
@click.option(
    "--resume-from",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="Continue from this checkpoint directory (counters, data position, RNG).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the result last.")
@_user_errors
def run_local_command(
    config: Path,
    model_dir: Path,
    slots: int | None,
    checkpoint_dir: Path | None,
    resume_from: Path | None,
    as_json: bool,
) -> None:
    """Train one trial on this machine exactly as a cluster slot would.

    CONFIG is the experiment YAML; MODEL_DIR holds the code its `entrypoint` names.
    """
    from assay.config import load_config, parse_config

    parsed = load_config(config)  # validate everything before importing torch
    if slots is not None:
        resources = dict(parsed.raw.get("resources") or {}, slots_per_trial=slots)
        parsed = parse_config({**parsed.raw, "resources": resources})
    if not model_dir.is_dir():
        raise AssayError(f"model directory {model_dir} does not exist")
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    from assay._local import run_local

    result = run_local(
        config=parsed,
        model_dir=model_dir,
        slots=slots,
        checkpoint_dir=checkpoint_dir,
        resume_from=resume_from,
    )
    if as_json:
        summary = {
            "total_batches": result.total_batches,
            "validation_metrics": result.validation_metrics,
            "checkpoint": result.checkpoint,
        }
        click.echo(json.dumps(summary))
    else:
        metrics = " ".join(f"{k}={v:.6g}" for k, v in sorted(result.validation_metrics.items()))
        click.echo(f"trained {result.total_batches} batches; validation: {metrics}")
        click.echo(f"checkpoint: {result.checkpoint}")


def main() -> None:
    cli(prog_name="assay")


if __name__ == "__main__":
    main()
