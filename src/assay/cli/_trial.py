"""`assay trial` (`assay t`): run one trial locally, or inspect a cluster trial."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import click

from assay.client import Client, metric, struct, trial_state
from assay.errors import AssayError, InvalidConfigError

from . import _format as fmt
from ._common import AliasedGroup, client, echo_json, user_errors
from ._logs import log_options, log_query, print_logs


@click.group("trial", cls=AliasedGroup)
def trial() -> None:
    """Work with single trials."""


@trial.command("run-local")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("model_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--slots", type=click.IntRange(min=1), help="Override resources.slots_per_trial.")
@click.option(
    "--config",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Set a config key, as `experiment create --config` does (dotted, e.g. "
    "searcher.max_length.batches=20; VALUE is YAML). Repeat for several.",
)
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
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="When the Trial's code raises, print the whole traceback (or set ASSAY_TRACEBACK=1).",
)
@user_errors
def run_local_command(
    config: Path,
    model_dir: Path,
    slots: int | None,
    overrides: tuple[str, ...],
    checkpoint_dir: Path | None,
    resume_from: Path | None,
    as_json: bool,
    verbose: bool,
) -> None:
    """Train one trial on this machine exactly as a cluster slot would.

    CONFIG is the experiment YAML; MODEL_DIR holds the code its `entrypoint` names. An
    error in the Trial's code ends with one line naming its file, line and function.
    """
    import os

    from assay.config import load_config, parse_config
    from assay.harness import entrypoint_problem

    if overrides:
        from ._template import apply_overrides, read_partial

        parsed = parse_config(apply_overrides(read_partial(config), overrides))
    else:
        parsed = load_config(config)  # validate everything before importing torch
    for warning in parsed.warnings:
        click.echo(f"warning: {warning}", err=True)
    if slots is not None:
        resources = dict(parsed.raw.get("resources") or {}, slots_per_trial=slots)
        try:
            parsed = parse_config({**parsed.raw, "resources": resources})
        except InvalidConfigError as e:  # name the flag that set it, not only the key
            said, flag = f"resources.slots_per_trial ({slots})", f"--slots {slots}"
            named = f"{flag} (resources.slots_per_trial)"
            raise InvalidConfigError([p.replace(said, named) for p in e.problems]) from None
    if not model_dir.is_dir():
        raise AssayError(f"model directory {model_dir} does not exist")
    problem = entrypoint_problem(parsed, model_dir)
    if problem is not None:
        raise AssayError(problem)
    if verbose:
        os.environ["ASSAY_TRACEBACK"] = "1"  # the worker processes of --slots N read it
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    from assay import run_local  # light: it logs its first line before torch loads

    try:
        result = run_local(
            config=parsed,
            model_dir=model_dir,
            slots=slots,
            checkpoint_dir=checkpoint_dir,
            resume_from=resume_from,
        )
    except Exception as e:
        _exit_with_one_line(e)
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


def _exit_with_one_line(error: Exception) -> None:
    """End a failed local run with one line naming the user's frame; the traceback before
    it with --verbose, or when no frame is the user's (the error is then Assay's)."""
    import traceback

    from assay.harness import describe, show_tracebacks, user_frame

    verbose = show_tracebacks()
    if isinstance(error, AssayError):
        if verbose and error.__cause__ is not None:
            traceback.print_exception(error.__cause__)
        raise error  # already one line: user_errors prints `error: ...`
    if verbose or user_frame(error) is None:
        traceback.print_exception(error)
    hint = "" if verbose else " (--verbose shows the traceback)"
    click.echo(f"error: {describe(error)}{hint}", err=True)
    sys.exit(1)


@trial.command("describe")
@click.argument("trial_id", metavar="ID", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@user_errors
def describe_command(trial_id: int, as_json: bool) -> None:
    """Show a trial: state, hyperparameters, progress, latest checkpoint."""
    t = fmt.trial_detail_dict(client().get_trial(trial_id))
    if as_json:
        echo_json(t)
        return
    fields = [
        ("ID", t["id"]),
        ("Experiment", t["experiment_id"]),
        ("State", t["state"]),
        ("Batches", t["total_batches"]),
        ("Best validation", metric(t["best_validation"])),
        ("Checkpoint", t["latest_checkpoint"]),
        ("Restarts", t["restarts"]),
        ("Last error", t["last_error"]),
        ("Copied from", _lineage(t)),
        ("Run", t["run_id"]),
        ("Seed", t["seed"]),
        ("Started", t["start_time"]),
        ("Ended", t["end_time"]),
    ]
    for key, value in fields:
        click.echo(f"{key + ':':17}{'-' if value is None else value}")
    click.echo("Hyperparameters:")
    for key, value in sorted(t["hparams"].items()):
        click.echo(f"  {key}: {json.dumps(value)}")


@trial.command("kill")
@click.argument("trial_id", metavar="ID", type=int)
@user_errors
def kill_command(trial_id: int) -> None:
    """Kill one trial of an active or paused experiment, without checkpointing.

    The trial ends CANCELED and its searcher sees it exit; the experiment goes on with
    its other trials (an experiment whose every trial was killed ends CANCELED).
    """
    result = client().kill_trial(trial_id)
    state = trial_state(result.state)
    ending = "killed" if state == "CANCELED" else "being killed"
    click.echo(f"trial {trial_id} of experiment {result.experiment_id} {ending} (state {state})")


def _lineage(t: dict[str, Any]) -> str | None:
    """`trial 3 (round 1)`: whose checkpoint the trial started from (pbt's exploit)."""
    if t["parent_trial_id"] is None:
        return None
    return f"trial {t['parent_trial_id']} (round {t['search_round']})"


@trial.command("logs")
@click.argument("trial_id", metavar="ID", type=int)
@log_options
@user_errors
def logs_command(trial_id: int, as_json: bool, **options: Any) -> None:
    """Print a trial's logs, every rank's, as `[rank R] message`.

    The filters (--rank, --level, --since, --grep) are applied by the master, before
    --head or --tail counts lines. Ctrl-C stops following; the trial goes on running.
    """
    print_logs(trial_id, log_query(**options), as_json=as_json)


@trial.command("metrics")
@click.argument("trial_id", metavar="ID", type=int)
@click.option(
    "--group",
    default="training",
    show_default=True,
    metavar="training|validation|NAME",
    help="Which metrics: training, validation, or a custom group.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, oldest report first.")
@user_errors
def metrics_command(trial_id: int, group: str, as_json: bool) -> None:
    """Print every metrics report of a trial in one group."""
    api = client()
    reports = sorted(api.get_trial_metrics(trial_id, group).reports, key=lambda r: r.total_batches)
    if not reports:
        _check_group(api, trial_id, group)
    rows: list[dict[str, Any]] = [
        {"total_batches": r.total_batches, "metrics": dict(sorted(r.metrics.items()))}
        for r in reports
    ]
    if as_json:
        echo_json(rows)
        return
    names = sorted({name for r in rows for name in r["metrics"]})
    click.echo(
        fmt.table(
            ["BATCHES", *names],
            [[r["total_batches"], *(metric(r["metrics"].get(n)) for n in names)] for r in rows],
        )
    )


def _check_group(api: Client, trial_id: int, group: str) -> None:
    """A group the trial has no reports in: name the groups it has, unless it has none
    yet and the group is one every trial reports (then the answer is just empty)."""
    experiment_id = api.get_trial(trial_id).experiment_id
    candidates = sorted({m.group for m in api.get_experiment(experiment_id).metric_names} - {group})
    has = [g for g in candidates if api.get_trial_metrics(trial_id, g, max_points=2).reports]
    if has:
        raise AssayError(
            f"trial {trial_id} has no {group!r} metrics; its groups are: {', '.join(has)}"
        )
    if group not in ("training", "validation"):
        raise AssayError(f"trial {trial_id} has no {group!r} metrics; it has reported none yet")


@trial.command("download")
@click.argument("trial_id", metavar="ID", type=int)
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False, path_type=Path))
@click.option("--best", "which", flag_value="best", help="Its best checkpoint (searcher.metric).")
@click.option("--latest", "which", flag_value="latest", help="Its checkpoint of the most batches.")
@click.option("--json", "as_json", is_flag=True, help="Print the checkpoint as one JSON object.")
@user_errors
def download_command(trial_id: int, directory: Path, which: str | None, as_json: bool) -> None:
    """Copy trial ID's best (--best) or latest (--latest) checkpoint into DIR (new or
    empty), verifying every file's size and sha256."""
    from assay.client import Trial, download_checkpoint

    if which is None:
        raise click.UsageError("say which checkpoint: --best or --latest")
    api = client()
    found = Trial(api, api.get_trial(trial_id))
    chosen = found.top_checkpoint() if which == "best" else found.latest_checkpoint()
    download_checkpoint(api, chosen.uuid, directory)
    if as_json:
        echo_json(fmt.checkpoint_dict(api.get_checkpoint(chosen.uuid)))
        return
    click.echo(
        f"downloaded trial {trial_id}'s {which} checkpoint {chosen.uuid} "
        f"(batch {chosen.total_batches}) to {directory}"
    )


@trial.command("download-tensorboard")
@click.argument("trial_id", metavar="ID", type=int)
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False, path_type=Path))
@user_errors
def download_tensorboard_command(trial_id: int, directory: Path) -> None:
    """Copy a trial's TensorBoard event files into DIR, for `tensorboard --logdir DIR`.

    A Trial's `context.get_tensorboard_writer()` writes them; they are kept beside the
    experiment's checkpoints, in `tensorboard/trial-<ID>` of its checkpoint_storage
    (shared_fs: read on this machine at the same path; s3: downloaded with the
    experiment's settings or boto3's credentials). Only regular files are copied: a
    symbolic link, a FIFO or an object name that would leave DIR is skipped, and said.
    """
    from pathlib import PurePosixPath

    from assay.client import NotFollowedError, copy_tree
    from assay.common.storage import TENSORBOARD, tensorboard_name

    api = client()
    t = api.get_trial(trial_id)
    config = struct(api.get_experiment(t.experiment_id).experiment.config)
    storage = config.get("checkpoint_storage") or {}
    if directory.exists() and any(directory.iterdir()):
        raise AssayError(f"{directory} already exists and is not empty")
    if isinstance(storage, dict) and storage.get("type") == "s3":
        from assay.client import storage_config
        from assay.common.storage import S3Storage

        s3_config = storage_config(t.experiment_id, api)
        assert s3_config is not None
        skipped: list[str] = []
        count = S3Storage.from_config(s3_config).download_tree(
            TENSORBOARD, f"trial-{trial_id}", directory, skipped
        )
    else:
        root = _shared_fs_root(api, t.experiment_id, trial_id, storage)
        source = root / tensorboard_name(trial_id)
        if not os.path.lexists(source):
            raise AssayError(
                f"trial {trial_id} has no TensorBoard files at {source} (is the checkpoint "
                "storage mounted here, and did the trial use get_tensorboard_writer()?)"
            )
        directory.mkdir(parents=True, exist_ok=True)
        try:
            copied = copy_tree(root, PurePosixPath(tensorboard_name(trial_id)), directory)
        except NotFollowedError as e:
            raise AssayError(f"trial {trial_id}'s TensorBoard files: {e}") from None
        count, skipped = copied.files, copied.skipped
    for line in skipped:
        click.echo(f"warning: skipped {line}", err=True)
    if count == 0:
        raise AssayError(f"trial {trial_id} stored no TensorBoard files")
    click.echo(f"downloaded {count} TensorBoard files of trial {trial_id} to {directory}")
    click.echo(f"view them with: tensorboard --logdir {directory}")


def _shared_fs_root(api: Any, experiment_id: int, trial_id: int, storage: Any) -> Path:
    """The experiment's shared_fs directory: `<host_path>/<storage_path>/<experiment id>`
    (the storage root itself for a trial that ran before experiments had directories of
    their own), else the directory the master put a checkpoint of the trial in."""
    from assay.common.storage import experiment_directory, tensorboard_name

    if isinstance(storage, dict) and storage.get("host_path"):
        root = Path(storage["host_path"]) / str(storage.get("storage_path") or "")
        own = experiment_directory(root, experiment_id)
        earlier = not (own / tensorboard_name(trial_id)).is_dir()
        return root if earlier and (root / tensorboard_name(trial_id)).is_dir() else own
    for checkpoint in api.list_checkpoints(experiment_id, trial_id):
        if checkpoint.location and "://" not in checkpoint.location:
            return Path(checkpoint.location).parent
    raise AssayError(
        f"trial {trial_id} has no checkpoint, so where its storage is cannot be told; its "
        "TensorBoard files are under <the master's checkpoint root>/<experiment id>/tensorboard"
    )
