"""`assay preview-search CONFIG`: what a search will run, without running anything.

The figures come from the rung arithmetic in `assay.config` (the same the master's
searchers use): trials per bracket, the length and the trials of each rung, and the total
budget. Nothing here talks to the master or imports torch or Optuna.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from assay.errors import InvalidConfigError

from ._common import echo_json, user_errors
from ._format import table


@click.command("preview-search")
@click.argument("config_file", metavar="CONFIG", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the preview as one JSON object.")
@user_errors
def preview_search(config_file: Path, as_json: bool) -> None:
    """Show the trials, rung lengths (pbt: rounds) and budget the searcher of CONFIG will use
    (custom: its plan comes from user code)."""
    from assay.config import load_config, preview, searcher_in_batches

    config = load_config(config_file)
    for warning in config.warnings:
        click.echo(f"warning: {warning}", err=True)
    searcher = config.searcher
    if searcher.name == "custom":
        _show_custom(searcher, as_json)
        return
    note = None
    if searcher.max_length.unit.value != "batches":
        # The master converts epochs with records_per_epoch; show its numbers when it can.
        try:
            searcher = searcher_in_batches(config)
            key = "length_per_round" if searcher.name == "pbt" else "max_length"
            note = (
                f"note: {key} {config.searcher.max_length.in_words()} is "
                f"{searcher.max_length.value} batches on a cluster (records_per_epoch "
                f"{config.records_per_epoch}, global_batch_size {config.global_batch_size})"
            )
        except InvalidConfigError:
            note = (
                "note: lengths are in epochs of the data loader (run-local); a cluster "
                "needs records_per_epoch to convert them to batches"
            )
    try:
        plan = preview(searcher, config.hyperparameters)
    except ValueError as e:  # a rule the parser already reports, or one of the conversion
        raise InvalidConfigError([str(e)]) from None
    if not searcher.max_length.bounded:
        note = (
            "note: no searcher.max_length: each trial's script trains as long as it decides "
            "(its lengths below stand for 'unbounded')"
        )
    if note is not None:
        click.echo(note, err=True)
    objectives = [
        {"name": o.name, "smaller_is_better": o.smaller_is_better} for o in searcher.objectives
    ]
    if as_json:
        echo_json({**plan.to_dict(), **({"metrics": objectives} if objectives else {})})
        return
    unit = plan.unit
    if objectives:
        listed = ", ".join(
            f"{o['name']} ({'lower' if o['smaller_is_better'] else 'higher'} is better)"
            for o in objectives
        )
        click.echo(f"metrics: {listed}; the experiment reports their Pareto front")
    if plan.rounds:
        _show_rounds(plan)
        return
    sampler = "" if plan.sampler == "random" else f", sampler {plan.sampler}"
    click.echo(f"searcher {plan.searcher}{sampler}; max_length {plan.max_length} {unit}")
    rows = []
    for i, bracket in enumerate(plan.brackets):
        for k, rung in enumerate(bracket.rungs):
            rows.append(
                [
                    i if k == 0 else "",
                    k,
                    rung.length,
                    rung.trials,
                    bracket.max_concurrent_trials or "unlimited" if k == 0 else "",
                    bracket.budget if k == 0 else "",
                ]
            )
    headers = ["BRACKET", "RUNG", f"LENGTH ({unit})", "TRIALS", "CONCURRENT", "BUDGET"]
    click.echo(table(headers, rows))
    click.echo(f"total: {plan.total_trials} trials, {plan.total_budget} {unit}")
    for i, bracket in enumerate(plan.brackets):
        empty = [k for k, rung in enumerate(bracket.rungs) if rung.trials == 0]
        if empty:
            click.echo(
                f"note: bracket {i} promotes no trial to rung {empty[0]} in synchronous "
                f"halving; raise max_trials or lower the number of rungs",
                err=True,
            )


def _show_rounds(plan: Any) -> None:
    """pbt: one row per round (its population, the new copies, the length all reach)."""
    unit = plan.unit
    click.echo(
        f"searcher pbt; {plan.max_concurrent_trials} trials, {len(plan.rounds)} rounds of "
        f"{plan.rounds[0].length} {unit}"
    )
    rows = [[r.round, r.trials, r.new_trials, r.length, r.budget] for r in plan.rounds]
    headers = ["ROUND", "TRIALS", "NEW", f"LENGTH ({unit})", "BUDGET"]
    click.echo(table(headers, rows))
    click.echo(f"total: {plan.total_trials} trials, {plan.total_budget} {unit}")


def _show_custom(searcher: Any, as_json: bool) -> None:
    """custom: no plan to show; the user's SearchMethod decides every trial."""
    from assay.config import UNBOUNDED_LENGTH

    bound = searcher.max_length
    max_length = None if bound.value >= UNBOUNDED_LENGTH else bound.to_dict()
    if as_json:
        echo_json(
            {
                "searcher": "custom",
                "plan": "user code",
                "metric": searcher.metric,
                "smaller_is_better": searcher.smaller_is_better,
                "max_trials": searcher.max_trials,
                "max_length": max_length,
            }
        )
        return
    direction = "lower" if searcher.smaller_is_better else "higher"
    click.echo(
        f"searcher custom: the plan comes from user code (a SearchMethod run by "
        f"assay.client.searcher's RemoteSearchRunner), not from the config; metric "
        f"{searcher.metric} ({direction} is better)"
    )
    bounds = []
    if searcher.max_trials is not None:
        bounds.append(f"at most {searcher.max_trials} trials")
    if max_length is not None:
        bounds.append(f"lengths up to {bound.value} {bound.unit.value}")
    if bounds:
        click.echo(f"bounds: {', '.join(bounds)}")
