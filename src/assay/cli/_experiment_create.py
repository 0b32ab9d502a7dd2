"""`assay experiment create`, `fork` and `continue`: what starts an experiment, and
`watch`, which follows one to its end (`create --follow`, `wait`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from assay.client import Client, experiment_seed, experiment_state, struct
from assay.errors import AssayError

from ._common import client, echo_json, user_errors
from ._watch import Watcher, summarize

if TYPE_CHECKING:
    from assay.proto import api_pb2


@click.command("create")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("model_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "-f", "--follow", is_flag=True, help="Print progress, trial states and logs until it ends."
)
@click.option("--paused", is_flag=True, help="Create it paused (start with `experiment activate`).")
@click.option(
    "--test",
    "test_mode",
    is_flag=True,
    help="Determined's test mode: one trial (searcher single, its first hyperparameters) "
    "of 1 batch, validated and checkpointed on the cluster, no restarts; implies --follow. "
    "Fails unless the trial completes and validates searcher.metric.",
)
@click.option("-q", "--quiet", is_flag=True, help="With --follow: print only the final summary.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print {"id": N}; with --follow, the summary as the last line.',
)
@click.option(
    "--config",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Set a config key (dotted, e.g. searcher.max_length.batches=200; VALUE is YAML). "
    "Repeat for several.",
)
@click.option(
    "--project",
    help="File it under this project (the config's `project`); WORKSPACE/PROJECT also "
    "sets the workspace.",
)
@click.option("--workspace", help="File it in this workspace (the config's `workspace`).")
@click.option(
    "--template",
    metavar="NAME",
    help="Merge CONFIG over template NAME (`assay template list`); --config applies last.",
)
@user_errors
def create_command(
    config: Path,
    model_dir: Path,
    follow: bool,
    paused: bool,
    test_mode: bool,
    quiet: bool,
    as_json: bool,
    overrides: tuple[str, ...],
    project: str | None,
    workspace: str | None,
    template: str | None,
) -> None:
    """Upload MODEL_DIR with the experiment CONFIG and start searching.

    The config is validated here first; MODEL_DIR is packed (honouring `.assayignore`)
    and must stay under 96 MiB compressed. With --follow, exits 0 only if the experiment
    completes; it ends with one line: the state, the best metric and its checkpoint.
    """
    from assay.common.archive import pack_model_dir, packed_checkpoint_warning
    from assay.config import load_config, searcher_in_batches

    if test_mode and paused:
        raise click.UsageError("--test runs the experiment at once; drop --paused")
    follow = follow or test_mode
    if follow and paused:
        raise click.UsageError("--follow needs a running experiment; drop --paused")
    overrides = (*overrides, *_filing(workspace, project))
    if overrides or template or test_mode:
        import yaml

        from assay.config import merge, parse_config

        from ._template import apply_overrides, read_partial

        data = read_partial(config)
        if template:
            base = yaml.safe_load(client().get_template(template).config_yaml)
            data = merge(base if isinstance(base, dict) else {}, data)
        data = apply_overrides(data, overrides)
        if test_mode:
            data = _test_mode(data)
        parsed = parse_config(data)
        text = yaml.safe_dump(data, sort_keys=False)
    else:
        parsed = load_config(config)  # every problem, with its key path, before any upload
        text = config.read_text()
    searcher_in_batches(parsed)  # the master's searchers count batches
    for warning in parsed.warnings:
        click.echo(f"warning: {warning}", err=True)
    if not model_dir.is_dir():
        raise AssayError(f"model directory {model_dir} does not exist")
    from assay.harness import entrypoint_problem

    problem = entrypoint_problem(parsed, model_dir)  # read, not imported: no torch here
    if problem is not None:
        raise AssayError(problem)
    archive = pack_model_dir(model_dir)
    packed_checkpoints = packed_checkpoint_warning(archive)
    if packed_checkpoints is not None:
        click.echo(f"warning: {packed_checkpoints}", err=True)
    api = client()
    response = api.create_experiment(text, archive, activate=not paused)
    created = response.experiment
    for warning in response.warnings:
        click.echo(f"warning: {warning}", err=True)
    if as_json:
        echo_json({"id": created.id})
    else:
        click.echo(f"Created experiment {created.id}" + (" (paused)" if paused else ""))
    if not follow:
        return
    watch(
        api,
        created.id,
        logs=True,
        quiet=quiet,
        as_json=as_json,
        verb="following",
        require_metric=test_mode,
    )


def _test_mode(data: dict[str, Any]) -> dict[str, Any]:
    """`data` as `--test` runs it: one trial of 1 batch (searcher single, the metric kept),
    which validates and checkpoints at its end, and no restarts."""
    searcher = data.get("searcher")
    searcher = searcher if isinstance(searcher, dict) else {}
    kept = {k: searcher[k] for k in ("metric", "metrics", "smaller_is_better") if k in searcher}
    name = data.get("name") if isinstance(data.get("name"), str) else "experiment"
    return {
        **data,
        "name": f"{name} (test)",
        "searcher": {"name": "single", **kept, "max_length": {"batches": 1}},
        "max_restarts": 0,
    }


def _filing(workspace: str | None, project: str | None) -> list[str]:
    """--workspace and --project as config overrides (quoted: a name is never YAML)."""
    import json

    if project and "/" in project:
        named, _, project = project.rpartition("/")
        if workspace and workspace != named:
            raise click.UsageError(f"--project {named}/{project} is not in --workspace {workspace}")
        workspace = named
    found = [("workspace", workspace), ("project", project)]
    return [f"{key}={json.dumps(value)}" for key, value in found if value]


def watch(
    api: Client,
    experiment_id: int,
    *,
    logs: bool,
    quiet: bool,
    as_json: bool,
    verb: str,
    timeout: float | None = None,
    require_metric: bool = False,
) -> None:
    """Watch until the experiment ends, print the summary, and fail unless it COMPLETED.
    `require_metric` (`--test`): fail too when no trial validated the searcher's metric,
    naming the metrics its trials did report.

    With --json, stdout holds only JSON (the summary last); what people read goes to stderr.
    """

    def out(line: str) -> None:
        click.echo(line, err=as_json)

    try:
        response = Watcher(api, experiment_id, out, logs=logs, quiet=quiet).run(timeout)
    except KeyboardInterrupt:
        click.echo(
            f"stopped {verb}; experiment {experiment_id} keeps running "
            f"(assay experiment describe {experiment_id})",
            err=True,
        )
        sys.exit(130)
    summary = summarize(api, response)
    if as_json:
        echo_json(summary.to_json())
    else:
        click.echo(summary.line())
    if summary.state != "COMPLETED":
        raise AssayError(f"experiment {experiment_id} ended in state {summary.state}")
    if require_metric and summary.best_validation is None:
        raise AssayError(missing_metric(api, response, summary.metric))


def missing_metric(api: Client, response: api_pb2.GetExperimentResponse, metric: str) -> str:
    """Why a test run that completed without the searcher's metric failed: the metric it
    expected, and the metrics its trials reported instead."""
    seen: dict[str, set[str]] = {"validation": set(), "training": set()}
    for t in response.trials:
        for group, names in seen.items():
            for report in api.get_trial_metrics(t.id, group).reports:
                names.update(report.metrics)
    expected = (
        f"--test: experiment {response.experiment.id} completed, but no trial reported the "
        f"searcher's metric {metric!r} (searcher.metric) in a validation, so a search would "
        "have nothing to rank its trials by"
    )
    if seen["validation"]:
        return f"{expected}; its validations reported {', '.join(sorted(seen['validation']))}"
    training = sorted(seen["training"])
    also = f" (training metrics: {', '.join(training)})" if training else ""
    return f"{expected}; it reported no validation metrics{also}"


# A secret as the master shows it (master/_secrets.py MASK): never a real value.
_MASKED = "********"


def _masked_keys(config: Any, at: str = "") -> list[str]:
    if isinstance(config, dict):
        return [k for key, v in config.items() for k in _masked_keys(v, f"{at}{key}.")]
    if isinstance(config, list):
        return [k for i, v in enumerate(config) for k in _masked_keys(v, f"{at}{i}.")]
    return [at.rstrip(".")] if config == _MASKED else []


@click.command("fork")
@click.argument("experiment_id", metavar="ID", type=int)
@click.option(
    "--config",
    "configs",
    multiple=True,
    metavar="FILE|KEY=VALUE",
    help="A partial config FILE merged over ID's config, or one KEY=VALUE set "
    "(dotted keys; VALUE is YAML). Repeat for several; applied in order.",
)
@click.option("--paused", is_flag=True, help="Create it paused (start with `experiment activate`).")
@click.option(
    "--reproduce",
    is_flag=True,
    help="Keep ID's reproducibility.experiment_seed (also one the master drew), so that "
    "the fork's trials get ID's hyperparameters and seeds in the same order; without it "
    "a seed ID's config did not set is drawn anew.",
)
@click.option(
    "--json", "as_json", is_flag=True, help='Print {"id": N, "forked_from": ID, "seed": S}.'
)
@user_errors
def fork_command(
    experiment_id: int, configs: tuple[str, ...], paused: bool, reproduce: bool, as_json: bool
) -> None:
    """Create a new experiment from experiment ID's config and model definition, with
    the changes --config gives. The new experiment starts from scratch (no checkpoint).

    A fork is a new search: unless ID's config or --config sets
    reproducibility.experiment_seed, the master draws a new seed, and the fork tries
    other points than ID; --reproduce keeps ID's seed."""
    import yaml

    from assay.config import parse_config

    from ._template import compose

    api = client()
    source = api.get_experiment(experiment_id).experiment
    seed = experiment_seed(struct(source.config))
    # The config as submitted (key order kept; a seed the master drew is only a comment
    # there), else its parsed form, less the seed unless --reproduce.
    base = yaml.safe_load(source.config_yaml) if source.config_yaml else None
    if not isinstance(base, dict):
        base = _without_seed(struct(source.config))
    data = compose(base, configs)
    if reproduce:
        data = _reproduced(data, experiment_id, seed)
    masked = _masked_keys(data)
    if masked:
        raise AssayError(
            f"experiment {experiment_id}'s config holds secrets the master does not show "
            f"({', '.join(masked)}): give each with --config {masked[0]}=VALUE"
        )
    parsed = parse_config(data)  # every problem, with its key path, before any upload
    for warning in parsed.warnings:
        click.echo(f"warning: {warning}", err=True)
    archive = api.get_model_definition(experiment_id)
    response = api.create_experiment(yaml.safe_dump(data, sort_keys=False), archive, not paused)
    for warning in response.warnings:
        click.echo(f"warning: {warning}", err=True)
    created = response.experiment.id
    got = experiment_seed(struct(response.experiment.config))
    if as_json:
        echo_json({"id": created, "forked_from": experiment_id, "seed": got})
    else:
        state = " (paused)" if paused else ""
        seeds = (
            f"seed {got}, as experiment {experiment_id}'s"
            if got == seed
            else f"a new seed, {got}; experiment {experiment_id} has {seed}: --reproduce keeps it"
        )
        click.echo(
            f"Created experiment {created}{state}, forked from experiment {experiment_id} ({seeds})"
        )


def _without_seed(config: dict[str, Any]) -> dict[str, Any]:
    repro = config.get("reproducibility")
    if not isinstance(repro, dict) or "experiment_seed" not in repro:
        return config
    rest = {k: v for k, v in repro.items() if k != "experiment_seed"}
    kept = {k: v for k, v in config.items() if k != "reproducibility"}
    return {**kept, "reproducibility": rest} if rest else kept


def _reproduced(data: dict[str, Any], experiment_id: int, seed: int) -> dict[str, Any]:
    """`data` with experiment `experiment_id`'s seed (`fork --reproduce`)."""
    repro = data.get("reproducibility")
    repro = repro if isinstance(repro, dict) else {}
    given = repro.get("experiment_seed")
    if given is not None and given != seed:
        raise click.UsageError(
            f"--reproduce keeps experiment {experiment_id}'s seed {seed}, but the config sets "
            f"reproducibility.experiment_seed: {given}; drop one of them"
        )
    return {**data, "reproducibility": {**repro, "experiment_seed": seed}}


@click.command("continue")
@click.argument("experiment_id", metavar="ID", type=int)
@click.option(
    "--config",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Change a config key (dotted; VALUE is YAML), e.g. searcher.max_length.batches=200. "
    "Repeat for several.",
)
@click.option(
    "--config-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A partial config FILE of the keys to change (--config applies over it).",
)
@user_errors
def continue_command(
    experiment_id: int, overrides: tuple[str, ...], config_file: Path | None
) -> None:
    """Continue a COMPLETED, CANCELED or ERROR single-trial experiment: its trial resumes
    from its latest checkpoint and trains on to the new searcher.max_length (its metrics
    go on from the batch count it had). Only searcher.max_length, max_restarts,
    min_validation_period and min_checkpoint_period may change; to change anything else,
    `experiment fork` starts a new experiment."""
    import yaml

    from ._template import apply_overrides, read_partial

    changes = read_partial(config_file) if config_file is not None else {}
    changes = apply_overrides(changes, overrides)
    text = yaml.safe_dump(changes, sort_keys=False) if changes else ""
    result = client().continue_experiment(experiment_id, text)
    length = (struct(result.config).get("searcher") or {}).get("max_length")
    to = ""
    if isinstance(length, dict):  # JSON numbers come back as floats: 8.0 reads as 8
        to = " to " + ", ".join(f"{v:g} {k}" for k, v in length.items())
    state = experiment_state(result.state)
    click.echo(f"experiment {experiment_id} continues{to} (state {state})")
