"""Comparing trials and the experiment list's columns, in headless Chromium against a real
master serving a store with three finished experiments (tests/webui/seeding.py).

Trials are picked on an experiment's page and a whole experiment in the list; the compare
page named by the pick shows a chart per metric with a line per trial, only the
hyperparameters that differ, and the best and last searcher metric against the first
trial's; the address alone shows the same after a reload, and ids that do not exist are
named in an error. The list's hyperparameter and metric columns are chosen once and kept
after a reload, and sorting by a metric or a hyperparameter orders the rows by it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from assay.master.store import Store
from tests.e2e.conftest import start_cluster, stop_cluster
from tests.webui.conftest import Site, screenshot
from tests.webui.seeding import SeededRun, seed_search

pytestmark = pytest.mark.slow


def _tick(box: Locator, checked: bool = True) -> None:
    """Click a checkbox and wait for it to show the new state. The page's boxes are
    controlled by the address or by stored state, which React applies after the click
    returns, so Playwright's own check() (which reads the state at once) can see the old
    one on a loaded machine."""
    box.click()
    if checked:
        expect(box).to_be_checked()
    else:
        expect(box).not_to_be_checked()


@dataclass
class Runs:
    site: Site
    a: SeededRun
    b: SeededRun
    c: SeededRun


@pytest.fixture(scope="module")
def runs(browser: Browser, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    tmp = tmp_path_factory.mktemp("webui-compare")
    (tmp / "master").mkdir()
    store = Store.open(f"sqlite:///{tmp / 'master' / 'assay.db'}")
    try:
        a = seed_search(
            store,
            "search-a",
            {
                "global_batch_size": 32,
                "lr": {"type": "log", "minval": -4, "maxval": -1, "base": 10},
                "dropout": 0.1,
            },
            [
                (
                    {"global_batch_size": 32, "lr": 0.001, "dropout": 0.1},
                    [(100, 0.40), (200, 0.60), (300, 0.55)],
                ),
                (
                    {"global_batch_size": 32, "lr": 0.01, "dropout": 0.1},
                    [(100, 0.30), (200, 0.50), (300, 0.52)],
                ),
            ],
        )
        b = seed_search(
            store,
            "single-b",
            {"global_batch_size": 64, "lr": 0.003, "dropout": 0.1},
            [
                (
                    {"global_batch_size": 64, "lr": 0.003, "dropout": 0.1},
                    [(100, 0.50), (200, 0.70), (300, 0.65)],
                )
            ],
        )
        c = seed_search(
            store,
            "loss-c",
            {"global_batch_size": 16, "lr": 0.1},
            [({"global_batch_size": 16, "lr": 0.1}, [(100, 0.9), (200, 0.4)])],
            metric="validation_loss",
            smaller_is_better=True,
        )
    finally:
        store.close()
    cluster = start_cluster(tmp, None, agents=0, slots=0)
    try:
        site = Site(cluster, browser, a.experiment_id, a.trial_ids, tmp)
        site.keep_session()
        yield Runs(site, a, b, c)
    finally:
        stop_cluster(cluster)


def _delta_row(page: Page, trial_id: int) -> Locator:
    return page.locator(f'[data-testid="delta-row"][data-trial="{trial_id}"]')


def _value(page: Page, trial_id: int, testid: str) -> float:
    text = (
        _delta_row(page, trial_id).locator(f'[data-testid="{testid}"]').get_attribute("data-value")
    )
    assert text is not None
    return float(text)


def test_pick_and_compare_trials_across_experiments(runs: Runs) -> None:
    site = runs.site
    a0, a1 = runs.a.trial_ids
    (b0,) = runs.b.trial_ids
    page = site.page()
    page.goto(f"{site.base}/experiments/{runs.a.experiment_id}")
    for trial_id in (a0, a1):
        _tick(
            page.locator(
                f'[data-testid="trial-row"][data-id="{trial_id}"] [data-testid="pick-trial"]'
            )
        )
    expect(page.locator('[data-testid="compare-picked"]')).to_contain_text("2 trials")

    # The pick is kept across pages: an experiment is added from the list.
    page.goto(site.base + "/")
    row = page.locator(f'[data-testid="experiment-row"][data-id="{runs.b.experiment_id}"]')
    _tick(row.locator('[data-testid="pick-experiment"]'))
    expect(page.locator('[data-testid="compare-picked"]')).to_have_text(
        "Picked to compare: 2 trials and 1 experiment"
    )
    page.locator('[data-testid="compare-open"]').click()
    page.wait_for_url(
        re.compile(rf"/compare\?trials={a0},{a1}&experiments={runs.b.experiment_id}$")
    )
    compare_url = page.url

    rows = page.locator('[data-testid="delta-row"]')
    expect(rows).to_have_count(3)
    assert [r.get_attribute("data-trial") for r in rows.all()] == [str(a0), str(a1), str(b0)]
    # Best and last accuracy, and their differences from the first trial (larger is better).
    assert _value(page, a0, "best") == pytest.approx(0.60)
    assert _value(page, a0, "last") == pytest.approx(0.55)
    assert _value(page, a1, "best-delta") == pytest.approx(0.52 - 0.60)
    assert _value(page, a1, "last-delta") == pytest.approx(0.52 - 0.55)
    assert _value(page, b0, "best-delta") == pytest.approx(0.70 - 0.60)
    assert _value(page, b0, "last-delta") == pytest.approx(0.65 - 0.55)
    expect(_delta_row(page, b0).locator('[data-testid="best-delta"]')).to_have_class(
        re.compile("delta-better")
    )
    expect(_delta_row(page, a1).locator('[data-testid="best-delta"]')).to_have_class(
        re.compile("delta-worse")
    )

    # Only the hyperparameters that differ; the equal ones on request.
    hparams = page.locator('[data-testid="hparam-row"]')
    expect(hparams).to_have_count(2)
    assert sorted(h.get_attribute("data-name") or "" for h in hparams.all()) == [
        "global_batch_size",
        "lr",
    ]
    expect(page.locator('[data-testid="compare-hparams-hidden"]')).to_contain_text(
        "1 hyperparameter"
    )
    _tick(page.locator('[data-testid="compare-hparams-all"]'))
    expect(hparams).to_have_count(3)
    expect(page.locator('[data-testid="hparam-row"][data-name="dropout"]')).to_be_visible()

    # A chart per metric, a line per trial, the legend naming experiment and trial.
    accuracy = page.locator('[data-testid="compare-chart"][data-metric="validation.accuracy"]')
    expect(accuracy).to_have_attribute("data-drawn", "3")
    expect(
        page.locator('[data-testid="compare-chart"][data-metric="training.loss"]')
    ).to_have_attribute("data-drawn", "3")
    expect(accuracy.locator(".u-legend")).to_contain_text(
        f"single-b (experiment {runs.b.experiment_id}) · trial {b0}"
    )
    screenshot(page, "compare")

    # The address alone shows the same comparison (another browser, nothing picked there).
    other = site.page()
    other.goto(compare_url)
    expect(other.locator('[data-testid="delta-row"]')).to_have_count(3)
    expect(other.locator('[data-testid="compare-chart"]').first).to_have_attribute(
        "data-drawn", "3"
    )
    other.context.close()

    # Removing a trial that came with its experiment keeps the rest.
    _delta_row(page, a0).locator('[data-testid="compare-remove"]').click()
    expect(rows).to_have_count(2)
    assert _value(page, b0, "best-delta") == pytest.approx(0.70 - 0.52)

    page.goto(site.base + "/")
    page.locator('[data-testid="compare-clear"]').click()
    expect(page.locator('[data-testid="compare-bar"]')).to_have_count(0)
    page.context.close()


def test_compare_names_what_does_not_exist(runs: Runs) -> None:
    page = runs.site.page()
    a0 = runs.a.trial_ids[0]
    page.goto(f"{runs.site.base}/compare?trials={a0},99999&experiments=88888")
    expect(page.locator('[data-testid="error"]')).to_contain_text("trial 99999: not found")
    expect(page.locator('[data-testid="error"]')).to_contain_text("experiment 88888: not found")
    expect(page.locator('[data-testid="delta-row"]')).to_have_count(1)
    page.goto(f"{runs.site.base}/compare?trials=abc")
    expect(page.locator('[data-testid="compare-empty"]')).to_be_visible()
    page.context.close()


def _expect_ids(page: Page, ids: list[str]) -> None:
    """The list shows exactly these experiments in this order (retried while the list
    re-renders: a sort the master does reloads it)."""
    rows = page.locator('[data-testid="experiment-row"]')
    expect(rows).to_have_count(len(ids))
    for i, x in enumerate(ids):
        expect(rows.nth(i)).to_have_attribute("data-id", x)


def test_list_columns_are_kept_and_sort_by_metric_and_hparam(runs: Runs) -> None:
    site = runs.site
    a, b, c = (str(r.experiment_id) for r in (runs.a, runs.b, runs.c))
    page = site.page()
    page.goto(site.base + "/")
    expect(page.locator('[data-testid="experiment-row"]')).to_have_count(3)
    page.locator('[data-testid="columns-button"]').click()
    menu = page.locator('[data-testid="columns-menu"]')
    _tick(menu.locator('[data-column="metric:accuracy"]'))
    _tick(menu.locator('[data-column="hp:global_batch_size"]'))
    _tick(menu.locator('[data-column="owner"]'), checked=False)
    page.locator('[data-testid="columns-button"]').click()
    head = page.locator('[data-testid="experiments"] thead')
    expect(head.locator('th[data-column="owner"]')).to_have_count(0)

    # Kept in this browser: a reload shows the same columns.
    page.reload()
    expect(head.locator('th[data-column="metric:accuracy"]')).to_be_visible()
    expect(head.locator('th[data-column="hp:global_batch_size"]')).to_be_visible()
    expect(head.locator('th[data-column="owner"]')).to_have_count(0)
    row_a = page.locator(f'[data-testid="experiment-row"][data-id="{a}"]')
    expect(row_a.locator('td[data-column="metric:accuracy"]')).to_have_text("0.6")
    expect(row_a.locator('td[data-column="hp:global_batch_size"]')).to_have_text("32")

    # Sorting by the metric: largest first, the experiment without it last either way.
    head.locator('th[data-column="metric:accuracy"]').click()
    expect(page).to_have_url(re.compile(r"sort=metric%3Aaccuracy&order=desc"))
    _expect_ids(page, [b, a, c])
    head.locator('th[data-column="metric:accuracy"]').click()
    _expect_ids(page, [a, b, c])

    head.locator('th[data-column="hp:global_batch_size"]').click()
    _expect_ids(page, [b, a, c])
    head.locator('th[data-column="hp:global_batch_size"]').click()
    _expect_ids(page, [c, a, b])
    screenshot(page, "experiments-columns")

    # A sort the master does (name) still works alongside.
    head.locator('th[data-column="name"]').click()
    expect(page).to_have_url(re.compile(r"sort=name"))
    _expect_ids(page, [c, a, b])
    page.context.close()
