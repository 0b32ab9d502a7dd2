"""`assay experiment` (`assay e`): create, follow, list, describe, control and await."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from assay.client import EXPERIMENT_STATE_GROUPS, experiment_states_in, struct
from assay.client import metric as metric_text
from assay.errors import AssayError

from . import _experiment_report as _report
from . import _format as fmt
from ._actions import run_action
from ._common import AliasedGroup, client, echo_json, user_errors
from ._experiment_create import continue_command, create_command, fork_command, watch
from ._logs import log_options, log_query, print_logs

if TYPE_CHECKING:
    from assay.proto import api_pb2


class _StateChoice(click.Choice[str]):
    """The states a user filters by (EXPERIMENT_STATE_GROUPS: CANCELED takes in the
    experiments still stopping toward it); an exact transient state is still taken,
    unlisted, by scripts that name one."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value.upper() in TRANSIENT_STATES:
            return value.upper()
        return super().convert(value, param, ctx)


TRANSIENT_STATES = ("STOPPING_CANCELED", "STOPPING_KILLED")
ACTIONS = ["pause", "activate", "cancel", "kill", "archive", "unarchive"]
SETTABLE = ["priority", "weight", "max-slots"]  # what `experiment set` changes
DESCRIBING = ["name", "description", "labels"]  # ... and these, in any state


@click.group("experiment", cls=AliasedGroup)
def experiment() -> None:
    """Create, watch and control experiments."""


experiment.add_command(create_command)
experiment.add_command(fork_command)
experiment.add_command(continue_command)


def _list_request(
    show_all: bool, states: tuple[str, ...], name: str | None, label: str | None, limit: int
) -> api_pb2.ListExperimentsRequest:
    from assay.proto import api_pb2, common_pb2

    request = api_pb2.ListExperimentsRequest(
        states=[
            common_pb2.ExperimentState.Value(f"EXPERIMENT_STATE_{s}")
            for s in experiment_states_in(states)
        ],
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
    type=_StateChoice(list(EXPERIMENT_STATE_GROUPS), case_sensitive=False),
    help="Only these states (repeat for several); CANCELED includes the experiments "
    "being canceled or killed.",
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
            metric_text(e["best_validation"]),
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
        config = struct(response.experiment.config)
        click.echo(fmt.trial_rows(list(response.trials), config))


@experiment.command("logs")
@click.argument("experiment_id", metavar="ID", type=int)
@log_options
@user_errors
def logs_command(experiment_id: int, as_json: bool, **options: Any) -> None:
    """Print the logs of the experiment's first trial (as Determined's `det e logs`),
    with `assay trial logs`'s filters; `assay trial logs ID` prints another's."""
    query = log_query(**options)
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
    print_logs(trials[0].id, query, as_json=as_json)


def _action_command(action: str) -> click.Command:
    @click.argument("experiment_id", metavar="ID", type=int)
    @user_errors
    def command(experiment_id: int) -> None:
        click.echo(run_action(client(), experiment_id, action))

    helps = {
        "pause": "Pause an experiment: its trials checkpoint and release their slots.",
        "activate": "Resume (or start) a paused experiment.",
        "cancel": "Stop an experiment gracefully: trials checkpoint, then stop.",
        "kill": "Stop an experiment now, without checkpointing; says how many trials it "
        "stopped once they have (waiting up to 30 s).",
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
    resources = struct(result.config).get("resources") or {}
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
