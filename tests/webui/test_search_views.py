"""A pbt search's lineage and a two-objective search's Pareto front, in headless Chromium.

Both experiments are written into a store that a master serves (no agent). The pbt one:
a population of four, trial 1's checkpoint copied in round 1 (the copy trained on and
checkpointed itself), the copy's checkpoint copied in round 2 (that copy still names its
parent's checkpoint as its latest). The two-objective one (val_loss smaller, accuracy
larger is better): three trials on the front, one dominated, one whose earlier validation
would dominate every trial but whose final one is dominated (a trial's point is its final
validation), and one that never reported accuracy (not drawn).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from assay.master.store import CheckpointRecord, MetricReport, Store, WriteBatch
from tests.e2e.conftest import start_cluster, stop_cluster
from tests.webui.conftest import Site, screenshot

pytestmark = pytest.mark.slow

PBT = {
    "name": "pbt-lineage",
    "entrypoint": "model_def:DigitsTrial",
    "hyperparameters": {"global_batch_size": 32, "lr": {"type": "log", "minval": -4, "maxval": -1}},
    "searcher": {
        "name": "pbt",
        "metric": "val_loss",
        "smaller_is_better": True,
        "population_size": 4,
        "num_rounds": 3,
        "length_per_round": {"batches": 100},
    },
}

TWO = {
    "name": "two-objectives",
    "entrypoint": "model_def:DigitsTrial",
    "hyperparameters": {"global_batch_size": 32, "lr": {"type": "log", "minval": -4, "maxval": -1}},
    "searcher": {
        "name": "random",
        "metrics": [
            {"name": "val_loss", "smaller_is_better": True},
            {"name": "accuracy", "smaller_is_better": False},
        ],
        "max_trials": 6,
        "max_length": {"batches": 200},
    },
}

# Per trial: its validations, (batches, {metric: value}).
POINTS: dict[str, list[tuple[int, dict[str, float]]]] = {
    "a": [(200, {"val_loss": 0.2, "accuracy": 0.90})],
    "b": [(200, {"val_loss": 0.1, "accuracy": 0.80})],
    "c": [(200, {"val_loss": 0.3, "accuracy": 0.85})],  # dominated by a
    "d": [  # its best of each metric at batch 100 would dominate all; its final does not
        (100, {"val_loss": 0.05, "accuracy": 0.95}),
        (200, {"val_loss": 0.4, "accuracy": 0.70}),
    ],
    "e": [(200, {"val_loss": 0.15, "accuracy": 0.85})],
    "f": [(200, {"val_loss": 0.01})],  # no accuracy: not drawn, never on the front
}


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass
class Seeded:
    pbt: int
    pbt_trials: list[int]  # the population (round 0), then the round 1 and round 2 copies
    two: int
    two_trials: dict[str, int]


def _experiment(store: Store, config: Mapping[str, Any]) -> int:
    experiment_id = store.reserve_id("experiments")
    batch = WriteBatch()
    batch.add_experiment(
        experiment_id,
        name=str(config["name"]),
        owner_id=store.user_id("admin"),
        config=dict(config),
        model_definition=b"",
        state="COMPLETED",
        description="",
        labels=[],
        priority=42,
        now=_now(),
    )
    store.apply(batch)
    return experiment_id


def _trial(
    store: Store,
    experiment_id: int,
    name: str,
    validations: Sequence[tuple[int, Mapping[str, float]]],
    first: int = 10,
    parent: int | None = None,
    search_round: int | None = None,
    checkpoints: Sequence[tuple[str, int]] = (),
    latest: str | None = None,
) -> int:
    trial_id = store.reserve_id("trials")
    batch = WriteBatch()
    batch.add_trial(
        trial_id,
        experiment_id=experiment_id,
        request_id=name,
        hparams={"global_batch_size": 32, "lr": 1e-3},
        seed=trial_id,
        state="RUNNING",
        now=_now(),
        parent_trial_id=parent,
        search_round=search_round,
    )
    batch.set_trial(trial_id, run_id=1)
    store.apply(batch)
    last = validations[-1][0]
    training = [MetricReport(b, {"loss": 1.0 / b}) for b in range(first, last + 1, 10)]
    store.report_metrics(trial_id, 1, "training", training)
    reports = [MetricReport(b, dict(values)) for b, values in validations]
    store.report_metrics(trial_id, 1, "validation", reports)
    for uuid, batches in checkpoints:
        store.add_checkpoint(
            CheckpointRecord(
                uuid=uuid,
                trial_id=trial_id,
                run_id=1,
                total_batches=batches,
                state="COMPLETED",
                location=f"/var/lib/assay/checkpoints/{uuid}",
                files={"state_dict.pt": 1024},
            )
        )
    first_metric = next(iter(validations[0][1]))
    batch = WriteBatch()
    batch.set_trial(
        trial_id,
        state="COMPLETED",
        total_batches=last,
        best_validation=min(v[first_metric] for _, v in validations),
        latest_checkpoint=latest or (checkpoints[-1][0] if checkpoints else None),
        start_time=_now(),
        end_time=_now(),
    )
    store.apply(batch)
    return trial_id


def _uuid(n: int) -> str:
    return f"{n:08x}-0000-4000-8000-000000000000"


def seed(store: Store) -> Seeded:
    pbt = _experiment(store, PBT)
    population = [
        _trial(
            store,
            pbt,
            f"p{i}",
            [(100, {"val_loss": 0.5 - i / 10}), (200, {"val_loss": 0.35 - i / 10})][: 1 + (i > 0)],
            checkpoints=[(_uuid(10 * i + 1), 100)] + ([(_uuid(10 * i + 2), 200)] if i > 0 else []),
        )
        for i in range(4)
    ]
    # Round 1: trial p1 (still training on to 200 and checkpointing there) is copied at its
    # checkpoint at batch 100; the copy's first report is at 110, its own checkpoint at 200.
    copy1 = _trial(
        store,
        pbt,
        "c1",
        [(200, {"val_loss": 0.15})],
        first=110,
        parent=population[1],
        search_round=1,
        checkpoints=[(_uuid(101), 200)],
    )
    # Round 2: the copy's checkpoint at 200 is copied; this copy still names it as latest.
    copy2 = _trial(
        store,
        pbt,
        "c2",
        [(300, {"val_loss": 0.1})],
        first=210,
        parent=copy1,
        search_round=2,
        latest=_uuid(101),
    )
    two = _experiment(store, TWO)
    two_trials = {name: _trial(store, two, name, vs) for name, vs in POINTS.items()}
    for experiment_id in (pbt, two):
        batch = WriteBatch()
        batch.set_experiment(experiment_id, progress=1.0, end_time=_now())
        store.apply(batch)
    return Seeded(pbt, [*population, copy1, copy2], two, two_trials)


@pytest.fixture(scope="module")
def seeded(
    browser: Browser, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Site, Seeded]]:
    tmp = tmp_path_factory.mktemp("webui-search-views")
    (tmp / "master").mkdir()
    store = Store.open(f"sqlite:///{tmp / 'master' / 'assay.db'}")
    try:
        data = seed(store)
    finally:
        store.close()
    cluster = start_cluster(tmp, None, agents=0, slots=0)
    try:
        site = Site(cluster, browser, data.pbt, data.pbt_trials, tmp)
        site.keep_session()
        yield site, data
    finally:
        stop_cluster(cluster)


def _http_json(page: Page, path: str) -> Any:
    """GET an API path with the page's session, as the app sends it."""
    text = page.evaluate(
        """async (path) => {
            const token = window.localStorage.getItem('assay.token');
            const r = await fetch(path, { headers: { Authorization: `Bearer ${token}` } });
            return await r.text();
        }""",
        path,
    )
    return json.loads(text)


def test_pbt_lineage_on_the_experiment_and_trial_pages(seeded: tuple[Site, Seeded]) -> None:
    site, data = seeded
    p0, p1, p2, p3, copy1, copy2 = data.pbt_trials
    page = site.page()
    page.goto(f"{site.base}/experiments/{data.pbt}")
    cells = page.locator('[data-testid="trial-lineage-cell"]')
    expect(cells).to_have_count(6)
    lineage = {
        int(row.get_attribute("data-id") or 0): (
            row.locator('[data-testid="trial-lineage-cell"]').get_attribute("data-round"),
            row.locator('[data-testid="trial-lineage-cell"]').get_attribute("data-parent"),
            row.locator('[data-testid="trial-lineage-cell"]').inner_text(),
        )
        for row in page.locator('[data-testid="trial-row"]').all()
    }
    assert lineage == {
        p0: ("0", "", "round 0"),
        p1: ("0", "", "round 0"),
        p2: ("0", "", "round 0"),
        p3: ("0", "", "round 0"),
        copy1: ("1", str(p1), f"round 1 · copied from trial {p1}"),
        copy2: ("2", str(copy1), f"round 2 · copied from trial {copy1}"),
    }
    # The lineage view: a column per round, each holding the trials it created.
    view = page.locator('[data-testid="lineage"]')
    expect(view).to_have_attribute("data-rounds", "3")
    columns = {
        col.get_attribute("data-round"): [
            (t.get_attribute("data-id"), t.get_attribute("data-parent"))
            for t in col.locator('[data-testid="lineage-trial"]').all()
        ]
        for col in view.locator('[data-testid="lineage-round"]').all()
    }
    assert columns == {
        "0": [(str(t), "") for t in (p0, p1, p2, p3)],
        "1": [(str(copy1), str(p1))],
        "2": [(str(copy2), str(copy1))],
    }
    # The HTTP API carries what the page shows.
    trials = _http_json(page, f"/api/v1/experiments/{data.pbt}")["trials"]
    by_id = {int(t["id"]): (t.get("parent_trial_id"), t.get("search_round")) for t in trials}
    assert by_id[copy2] == (copy1, 2)
    assert by_id[p0] == (None, None)
    screenshot(page, "pbt-lineage")

    # The copy's link opens its parent's page; the copy's page names where it started.
    page.locator(f'[data-testid="trial-row"][data-id="{copy1}"] a', has_text=f"trial {p1}").click()
    page.wait_for_url(f"**/trials/{p1}")
    expect(page.locator('[data-testid="trial-state"]')).to_be_visible()
    expect(page.locator('[data-testid="trial-lineage"]')).to_have_count(0)
    for trial, parent, batch, round_ in ((copy1, p1, 100, 1), (copy2, copy1, 200, 2)):
        page.goto(f"{site.base}/trials/{trial}")
        line = page.locator('[data-testid="trial-lineage"]')
        expect(line).to_have_attribute("data-batch", str(batch))
        expect(line).to_have_text(
            f"Started from trial {parent}'s checkpoint at batch {batch} (round {round_})"
        )
    page.locator('[data-testid="trial-lineage"] a').click()
    page.wait_for_url(f"**/trials/{copy1}")
    screenshot(page, "pbt-copy-trial")
    page.context.close()


def test_the_pareto_scatter_marks_and_joins_the_front(seeded: tuple[Site, Seeded]) -> None:
    site, data = seeded
    ids = data.two_trials
    page = site.page()
    page.goto(f"{site.base}/experiments/{data.two}")
    chart = page.locator('[data-testid="pareto"]')
    # f never reported accuracy: five points; the front by val_loss is b, e, a.
    expect(chart).to_have_attribute("data-points", "5")
    front = [ids["b"], ids["e"], ids["a"]]
    expect(chart).to_have_attribute("data-front", ",".join(str(t) for t in front))
    points = {
        int(c.get_attribute("data-trial") or 0): (
            c.get_attribute("data-on-front"),
            float(c.get_attribute("data-x") or "nan"),
            float(c.get_attribute("data-y") or "nan"),
        )
        for c in chart.locator('[data-testid="pareto-point"]').all()
    }
    # Each point is a trial's final validation: d's (0.4, 0.7), not its earlier best.
    assert points == {
        ids["a"]: ("1", 0.2, 0.9),
        ids["b"]: ("1", 0.1, 0.8),
        ids["c"]: ("0", 0.3, 0.85),
        ids["d"]: ("0", 0.4, 0.7),
        ids["e"]: ("1", 0.15, 0.85),
    }
    # The front is joined left to right through its three points; the rest are dimmed.
    line = chart.locator('[data-testid="pareto-front-line"]').get_attribute("points") or ""
    xs = [float(p.split(",")[0]) for p in line.split()]
    assert len(xs) == 3
    assert xs == sorted(xs)
    dimmed = chart.locator('[data-testid="pareto-point"][data-on-front="0"]').first
    on_front = chart.locator('[data-testid="pareto-point"][data-on-front="1"]').first
    opacity = "el => Number(getComputedStyle(el).opacity)"
    assert dimmed.evaluate(opacity) < 1
    assert on_front.evaluate(opacity) == 1
    expect(chart.locator('[data-testid="pareto-x-label"]')).to_have_text(
        "val_loss (↓ smaller is better)"
    )
    expect(chart.locator('[data-testid="pareto-y-label"]')).to_have_text(
        "accuracy (↑ larger is better)"
    )
    title = chart.locator(f'[data-testid="pareto-point"][data-trial="{ids["e"]}"] title')
    assert title.text_content() == (
        f"Trial {ids['e']} (on the front), at batch 200: val_loss 0.15, accuracy 0.85"
    )
    # The first objective serves where one metric is shown (the header, the curves).
    expect(page.locator(".facts")).to_contain_text("Best val_loss")
    expect(page.locator('[data-testid="metric-select"]')).to_have_value("validation\u0000val_loss")
    # The page's front is the API's.
    http = _http_json(page, f"/api/v1/experiments/{data.two}")
    assert [int(p["trial_id"]) for p in http["pareto_points"] if p["on_front"]] == sorted(front)
    assert [o["name"] for o in http["objectives"]] == ["val_loss", "accuracy"]
    screenshot(page, "pareto-front")
    # A point opens its trial.
    chart.locator(f'[data-testid="pareto-point"][data-trial="{ids["c"]}"]').click()
    page.wait_for_url(f"**/trials/{ids['c']}")
    # A one-metric experiment has no scatter, and no lineage outside pbt.
    page.goto(f"{site.base}/experiments/{data.pbt}")
    expect(page.locator('[data-testid="lineage"]')).to_be_visible()
    expect(page.locator('[data-testid="pareto"]')).to_have_count(0)
    page.goto(f"{site.base}/experiments/{data.two}")
    expect(chart).to_be_visible()
    expect(page.locator('[data-testid="lineage"]')).to_have_count(0)
    page.context.close()
