"""`assay experiment` (`assay e`): create, follow, list, describe, control and await."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from assay.errors import AssayError

from . import _experiment_report as _report
from . import _format as fmt
from ._client import Client, client
from ._common import AliasedGroup, echo_json, user_errors
from ._trial import log_options, print_logs
from ._watch import Watcher, summarize

if TYPE_CHECKING:
    from assay.proto import api_pb2

STATES = [
    "ACTIVE",
    "PAUSED",
    "STOPPING_CANCELED",
    "STOPPING_KILLED",
    "COMPLETED",
    "CANCELED",
    "ERROR",
]
ACTIONS = ["pause", "activate", "cancel", "kill", "archive", "unarchive"]
SETTABLE = ["priority", "weight", "max-slots"]  # what `experiment set` changes
DESCRIBING = ["name", "description", "labels"]  # ... and these, in any state


@click.group("experiment", cls=AliasedGroup)
def experiment() -> None:
    """Create, watch and control experiments."""


@experiment.command("create")
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
    "of 1 batch, validated and checkpointed on the cluster, no restarts; implies --follow.",
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

        from assay.config import parse_config
        from assay.config._merge import merge

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
    from assay._precheck import entrypoint_problem

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
    watch(api, created.id, logs=True, quiet=quiet, as_json=as_json, verb="following")


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
) -> None:
    """Watch until the experiment ends, print the summary, and fail unless it COMPLETED.

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


def _list_request(
    show_all: bool, states: tuple[str, ...], name: str | None, label: str | None, limit: int
) -> api_pb2.ListExperimentsRequest:
    from assay.proto import api_pb2, common_pb2

    request = api_pb2.ListExperimentsRequest(
        states=[common_pb2.ExperimentState.Value(f"EXPERIMENT_STATE_{s.upper()}") for s in states],
        name=name or "",
        label=label or "",
        limit=limit,
        sort_by="id",
        ascending=False,  # the newest `limit`; shown oldest first
    )
    if not show_all:
        request.archived = False
    return request


@experiment.command("list")
@click.option("--all", "show_all", is_flag=True, help="Include archived experiments.")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(STATES, case_sensitive=False),
    help="Only these states (repeat for several).",
)
@click.option("--name", help="Only names containing this (case-insensitive).")
@click.option("--label", help="Only experiments with this label.")
@click.option("--workspace", help="Only experiments of this workspace.")
@click.option("--project", help="Only experiments of projects of this name.")
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@user_errors
def list_command(
    show_all: bool,
    states: tuple[str, ...],
    name: str | None,
    label: str | None,
    workspace: str | None,
    project: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List the newest experiments of your workspaces, oldest first (archived ones only
    with --all)."""
    request = _list_request(show_all, states, name, label, limit)
    request.workspace, request.project = workspace or "", project or ""
    response = client().list_experiments(request)
    experiments = sorted(
        (fmt.experiment_summary(e) for e in response.experiments), key=lambda e: e["id"]
    )
    if as_json:
        echo_json(experiments)
        return
    rows = [
        [
            e["id"],
            e["name"],
            e["state"] + (" (archived)" if e["archived"] else ""),
            fmt.progress(e["state"], e["progress"]),
            e["num_trials"],
            fmt.metric(e["best_validation"]),
            e["owner"] or None,
            ",".join(e["labels"]) or None,
            e["start_time"],
        ]
        for e in experiments
    ]
    headers = ["ID", "NAME", "STATE", "PROGRESS", "TRIALS", "BEST", "OWNER", "LABELS", "STARTED"]
    click.echo(fmt.table(headers, rows))
    if response.total > len(experiments):
        click.echo(f"(the newest {len(experiments)} of {response.total}; --limit N shows more)")


@experiment.command("describe")
@click.argument("experiment_id", metavar="ID", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@user_errors
def describe_command(experiment_id: int, as_json: bool) -> None:
    """Show an experiment's state, progress and best trial, then a table of its trials
    (HPARAMS: the searched hyperparameters) and why any of them failed. --json adds its
    config (each trial's `last_error` says why it failed)."""
    response = client().get_experiment(experiment_id)
    if as_json:
        echo_json(_report.as_dict(response))
        return
    click.echo(_report.as_text(response))


@experiment.command("list-trials")
@click.argument("experiment_id", metavar="ID", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@user_errors
def list_trials_command(experiment_id: int, as_json: bool) -> None:
    """List the trials of an experiment."""
    response = client().get_experiment(experiment_id)
    if as_json:
        echo_json([fmt.trial_dict(t) for t in response.trials])
    else:
        config = fmt.struct(response.experiment.config)
        click.echo(fmt.trial_rows(list(response.trials), config))


@experiment.command("logs")
@click.argument("experiment_id", metavar="ID", type=int)
@log_options
@user_errors
def logs_command(experiment_id: int, follow: bool, tail: int | None, as_json: bool) -> None:
    """Print the logs of the experiment's first trial (as Determined's `det e logs`);
    `assay trial logs ID` prints another's."""
    trials = sorted(client().get_experiment(experiment_id).trials, key=lambda t: t.id)
    if not trials:
        raise click.ClickException(f"experiment {experiment_id} has no trials yet")
    if len(trials) > 1:
        others = ", ".join(str(t.id) for t in trials[1:6]) + (", ..." if len(trials) > 6 else "")
        click.echo(
            f"experiment {experiment_id} has {len(trials)} trials: the logs of trial "
            f"{trials[0].id} (`assay trial logs ID` for the others: {others})",
            err=True,
        )
    print_logs(trials[0].id, follow=follow, tail=tail, as_json=as_json)


def _action_command(action: str) -> click.Command:
    done = {
        "pause": "paused",
        "activate": "activated",
        "cancel": "canceling",
        "kill": "killing",
        "archive": "archived",
        "unarchive": "unarchived",
    }[action]

    @click.argument("experiment_id", metavar="ID", type=int)
    @user_errors
    def command(experiment_id: int) -> None:
        from assay.proto import api_pb2

        kind = api_pb2.ExperimentActionKind.Value(f"EXPERIMENT_ACTION_{action.upper()}")
        result = client().experiment_action(experiment_id, kind)
        state = fmt.experiment_state(result.state)
        click.echo(f"experiment {experiment_id} {done} (state {state})")

    helps = {
        "pause": "Pause an experiment: its trials checkpoint and release their slots.",
        "activate": "Resume (or start) a paused experiment.",
        "cancel": "Stop an experiment gracefully: trials checkpoint, then stop.",
        "kill": "Stop an experiment now, without checkpointing.",
        "archive": "Hide a finished experiment from `experiment list`.",
        "unarchive": "Show an archived experiment in `experiment list` again.",
    }
    return click.command(action, help=helps[action])(command)


for _action in ACTIONS:
    experiment.add_command(_action_command(_action))


@experiment.command("set")
@click.argument(
    "name",
    metavar="priority|weight|max-slots|name|description|labels",
    type=click.Choice(SETTABLE + DESCRIBING),
)
@click.argument("experiment_id", metavar="ID", type=int)
@click.argument("value", metavar="VALUE")
@user_errors
def set_command(name: str, experiment_id: int, value: str) -> None:
    """Change a live experiment's priority (1..99, lower first), fair-share weight (> 0)
    or max-slots (>= 1); its queued trials take the value at the next scheduling round,
    and the stored config keeps it. The name, description and labels (comma-separated;
    "" for none) of any experiment change too."""
    if name in DESCRIBING:
        labels = [x.strip() for x in value.split(",") if x.strip()]
        patched = client().patch_experiment(
            experiment_id,
            name=value if name == "name" else None,
            description=value if name == "description" else None,
            labels=labels if name == "labels" else None,
        )
        now = ", ".join(patched.labels) or "(none)" if name == "labels" else value
        click.echo(f"experiment {experiment_id}: {name} is now {now}")
        return
    result = client().set_experiment_resource(experiment_id, name, value)
    resources = fmt.struct(result.config).get("resources") or {}
    key = name.replace("-", "_")
    shown = result.priority if name == "priority" else resources.get(key, value)
    if isinstance(shown, float):
        shown = f"{shown:g}"  # JSON numbers come back as floats: 2.0 reads as 2
    click.echo(f"experiment {experiment_id}: {name} is now {shown}")


@experiment.command("wait")
@click.argument("experiment_id", metavar="ID", type=int)
@click.option("--timeout", type=click.FloatRange(min=0), help="Give up after this many seconds.")
@click.option("-q", "--quiet", is_flag=True, help="Print only the final summary.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
@user_errors
def wait_command(experiment_id: int, timeout: float | None, quiet: bool, as_json: bool) -> None:
    """Wait until an experiment ends, printing its progress; exit 0 only if it COMPLETED.

    The last line says how it ended: the state, the best metric and its checkpoint.
    """
    watch(
        client(),
        experiment_id,
        logs=False,
        quiet=quiet,
        as_json=as_json,
        verb="waiting",
        timeout=timeout,
    )


# A secret as the master shows it (master/_secrets.py MASK): never a real value.
_MASKED = "********"


def _masked_keys(config: Any, at: str = "") -> list[str]:
    if isinstance(config, dict):
        return [k for key, v in config.items() for k in _masked_keys(v, f"{at}{key}.")]
    if isinstance(config, list):
        return [k for i, v in enumerate(config) for k in _masked_keys(v, f"{at}{i}.")]
    return [at.rstrip(".")] if config == _MASKED else []


@experiment.command("fork")
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
@click.option("--json", "as_json", is_flag=True, help='Print {"id": N, "forked_from": ID}.')
@user_errors
def fork_command(experiment_id: int, configs: tuple[str, ...], paused: bool, as_json: bool) -> None:
    """Create a new experiment from experiment ID's config and model definition, with
    the changes --config gives. The new experiment starts from scratch (no checkpoint)."""
    import yaml

    from assay.config import parse_config

    from ._template import compose

    api = client()
    source = api.get_experiment(experiment_id).experiment
    # The config as submitted (key order kept), else its parsed form.
    base = yaml.safe_load(source.config_yaml) if source.config_yaml else None
    data = compose(base if isinstance(base, dict) else fmt.struct(source.config), configs)
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
    if as_json:
        echo_json({"id": created, "forked_from": experiment_id})
    else:
        state = " (paused)" if paused else ""
        click.echo(f"Created experiment {created}{state}, forked from experiment {experiment_id}")


@experiment.command("continue")
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
    length = (fmt.struct(result.config).get("searcher") or {}).get("max_length")
    to = ""
    if isinstance(length, dict):  # JSON numbers come back as floats: 8.0 reads as 8
        to = " to " + ", ".join(f"{v:g} {k}" for k, v in length.items())
    state = fmt.experiment_state(result.state)
    click.echo(f"experiment {experiment_id} continues{to} (state {state})")


@experiment.command("download-model-def")
@click.argument("experiment_id", metavar="ID", type=int)
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False, path_type=Path))
@user_errors
def download_model_def_command(experiment_id: int, directory: Path) -> None:
    """Unpack experiment ID's model definition, as it was uploaded, into DIR (new or empty)."""
    from assay.common.archive import unpack_model_dir

    data = client().get_model_definition(experiment_id)
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise AssayError(f"{directory} is not empty: give a new or empty directory")
    unpack_model_dir(data, directory)
    count = sum(1 for p in directory.rglob("*") if p.is_file())
    click.echo(f"experiment {experiment_id}'s model definition ({count} files) is in {directory}")


@experiment.command("delete")
@click.argument("experiment_id", metavar="ID", type=int)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@user_errors
def delete_command(experiment_id: int, yes: bool) -> None:
    """Delete an ended experiment: its checkpoints' files, then its trials, metrics,
    logs and checkpoint records, for good.

    The master refuses (and deletes nothing) while the experiment is active, paused or
    stopping (kill it first), or while a version of a model in the experiment's own
    workspace uses one of its checkpoints (the message names them); versions of other
    workspaces' models are marked as having lost them.
    """
    if not yes:
        try:
            sure = click.confirm(
                f"Delete experiment {experiment_id}, its metrics, logs and checkpoints for good?",
                default=False,
            )
        except click.Abort:  # no answer (stdin closed, or Ctrl-D)
            sure = False
        if not sure:
            raise AssayError("nothing deleted (pass --yes to skip this question)")
    answer = client().delete_experiment(experiment_id)
    count = len(answer.deleted_checkpoints)
    click.echo(
        f"deleted experiment {experiment_id} and {count} checkpoint{'s' if count != 1 else ''}"
    )
    if answer.failed:
        for uuid, why in sorted(answer.failed.items()):
            click.echo(f"failed {uuid}: {why}", err=True)
        raise AssayError(
            f"experiment {experiment_id} is deleted, but the files of {len(answer.failed)} of "
            "its checkpoints could not be (left where they are, named above)"
        )


@experiment.group("label", cls=AliasedGroup)
def label_group() -> None:
    """Add or remove an experiment's labels."""


@label_group.command("add")
@click.argument("experiment_id", metavar="ID", type=int)
@click.argument("label")
@user_errors
def label_add_command(experiment_id: int, label: str) -> None:
    """Give experiment ID the label LABEL (nothing changes if it has it)."""
    patched = client().patch_experiment(experiment_id, add_labels=[label])
    click.echo(f"experiment {experiment_id}: labels {', '.join(patched.labels)}")


@label_group.command("remove")
@click.argument("experiment_id", metavar="ID", type=int)
@click.argument("label")
@user_errors
def label_remove_command(experiment_id: int, label: str) -> None:
    """Take LABEL off experiment ID (nothing changes if it does not have it)."""
    patched = client().patch_experiment(experiment_id, remove_labels=[label])
    click.echo(f"experiment {experiment_id}: labels {', '.join(patched.labels) or '(none)'}")
