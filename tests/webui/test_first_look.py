"""What the pages say before anyone asks, in headless Chromium against a real master and a
real agent of 2 slots.

An experiment of 8 slots per trial can never start there: the list and its page say why,
in the words `assay experiment create` warns with. A single validation is drawn with a
margin around it, not on an axis from 0 to twice its value; a chart's legend shows each
series' latest value until a point is hovered; the trial page's checkpoint table fits its
card at 1440 px; an ASHA search's training curves are drawn beside its validation markers;
and the state filters name where an experiment ends ("canceled" takes the stopping states).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import parse_qs, urlparse

import pytest
from playwright.sync_api import Browser, Page, expect

from assay.master.store import CheckpointRecord, Store, WriteBatch
from tests.e2e.conftest import ROOT, start_cluster, stop_cluster
from tests.webui.conftest import SEARCH, Site, screenshot
from tests.webui.seeding import Seeded, seed_asha, seed_search

pytestmark = pytest.mark.slow

# The digits search with trials of 8 slots (the batch size split evenly over them).
TOO_BIG = (
    SEARCH.replace("name: digits-web", "name: too-big").replace(
        "global_batch_size: 32", "global_batch_size: 64"
    )
    + "resources: {slots_per_trial: 8}\n"
)
WHY = "needs 8 CPU slots; the cluster has 2 (1 agent)"
# Checkpoints of the ASHA search's third trial with four validation metrics each.
METRICS = {"accuracy": 0.9123, "top5_accuracy": 0.99, "validation_error": 0.0877}
METRICS["validation_loss"] = 0.312345


@dataclass
class Data:
    asha: Seeded
    single: int  # one trial, one validation: accuracy 0.9 at batch 100
    single_trial: int
    canceled: int
    too_big: int
    create_stderr: str


def _seed(store: Store) -> tuple[Seeded, int, int, int]:
    asha = seed_asha(store)
    for k, batches in enumerate([300, 600, 900]):
        uuid = f"2222222{k}-2222-4333-8444-555555555555"
        store.add_checkpoint(
            CheckpointRecord(
                uuid=uuid,
                trial_id=asha.trial_ids[2],
                run_id=1,
                total_batches=batches,
                state="COMPLETED",
                location=f"/var/lib/assay/checkpoints/{uuid}",
                files={"models.pt": 48_213, "optimizer.pt": 96_000},
                user_metadata={"validation_metrics": METRICS},
            )
        )
    single = seed_search(store, "one-point", {"lr": 0.01}, [({"lr": 0.01}, [(100, 0.9)])])
    canceled = seed_search(store, "called-off", {"lr": 0.02}, [({"lr": 0.02}, [(50, 0.5)])])
    batch = WriteBatch()
    batch.set_experiment(canceled.experiment_id, state="CANCELED")
    store.apply(batch)
    return asha, single.experiment_id, single.trial_ids[0], canceled.experiment_id


@pytest.fixture(scope="module")
def first_look(
    browser: Browser, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Site, Data]]:
    tmp = tmp_path_factory.mktemp("webui-first-look")
    (tmp / "master").mkdir()
    store = Store.open(f"sqlite:///{tmp / 'master' / 'assay.db'}")
    try:
        asha, single, single_trial, canceled = _seed(store)
    finally:
        store.close()
    cluster = start_cluster(tmp, None, agents=1, slots=2)
    try:
        site = Site(cluster, browser, asha.experiment_id, asha.trial_ids, tmp)
        site.keep_session()
        config = tmp / "too-big.yaml"
        config.write_text(TOO_BIG)
        model = str(ROOT / "examples" / "digits")
        created = cluster.cli("experiment", "create", str(config), model, "--json")
        assert created.returncode == 0, created.stderr
        too_big = int(json.loads(created.stdout.strip().splitlines()[-1])["id"])
        data = Data(asha, single, single_trial, canceled, too_big, created.stderr)
        yield site, data
    finally:
        stop_cluster(cluster)


def _page(site: Site, width: int = 1400) -> Page:
    context = site.browser.new_context(
        viewport={"width": width, "height": 900}, storage_state=site.session
    )
    page = context.new_page()
    page.set_default_timeout(20_000)
    return page


def _y_range(page: Page, selector: str) -> tuple[float, float]:
    chart = page.locator(f"{selector}[data-y-range]")
    chart.wait_for()
    low, high = json.loads(chart.get_attribute("data-y-range") or "[]")
    return float(low), float(high)


def test_an_experiment_that_can_never_start_says_why_in_the_list_and_on_its_page(
    first_look: tuple[Site, Data],
) -> None:
    site, data = first_look
    # The reason the CLI gives: at create, and in describe for each queued trial.
    assert f"each {WHY};" in data.create_stderr, data.create_stderr
    described = site.describe(data.too_big)
    assert {t["waiting"] for t in described["trials"]} == {WHY}, described["trials"]
    page = _page(site)
    page.goto(site.base + "/")
    row = page.locator(f'[data-testid="experiment-row"][data-id="{data.too_big}"]')
    expect(row.locator('[data-testid="experiment-state"]')).to_have_text("active")
    expect(row.locator('[data-testid="experiment-waiting"]')).to_have_text(f"waiting: {WHY}")
    # Only that one: the finished ones wait for nothing.
    expect(page.locator('[data-testid="experiment-waiting"]')).to_have_count(1)
    screenshot(page, "list-waiting")
    page.goto(f"{site.base}/experiments/{data.too_big}")
    notice = page.locator('[data-testid="experiment-waiting"]')
    expect(notice).to_contain_text(f"its trials cannot start on this cluster as it is: each {WHY}.")
    expect(page.locator('[data-testid="trial-row"] .waiting-note').first).to_have_text(
        f"waiting: {WHY}"
    )
    screenshot(page, "experiment-waiting")
    page.goto(f"{site.base}/experiments/{data.single}")
    expect(page.locator('[data-testid="curves"][data-drawn="1"]')).to_be_visible()
    expect(page.locator('[data-testid="experiment-waiting"]')).to_have_count(0)
    page.context.close()


def test_a_single_point_gets_a_margin_around_it_not_an_axis_to_twice_its_value(
    first_look: tuple[Site, Data],
) -> None:
    site, data = first_look
    page = _page(site)
    page.goto(f"{site.base}/experiments/{data.single}")
    low, high = _y_range(page, '[data-testid="curves"]')
    assert 0.8 <= low < 0.9 < high <= 1.0, (low, high)
    page.goto(f"{site.base}/trials/{data.single_trial}")
    low, high = _y_range(page, '[data-testid="metric-chart"][data-metric="accuracy"]')
    assert 0.8 <= low < 0.9 < high <= 1.0, (low, high)
    screenshot(page, "trial-single-point")
    # Values that differ keep an axis about them: ASHA's accuracies run 0.24 to 0.82.
    page.goto(f"{site.base}/experiments/{data.asha.experiment_id}")
    low, high = _y_range(page, '[data-testid="curves"]')
    assert 0.0 <= low <= 0.24, (low, high)
    assert 0.82 <= high <= 1.0, (low, high)
    page.context.close()


def test_the_legend_shows_the_latest_values_until_a_point_is_hovered(
    first_look: tuple[Site, Data],
) -> None:
    site, data = first_look
    page = _page(site)
    page.goto(f"{site.base}/trials/{data.single_trial}")
    charts = page.locator('[data-testid="trial-charts"][data-drawn="2"]')
    expect(charts).to_be_visible()
    accuracy = page.locator('[data-testid="metric-chart"][data-metric="accuracy"] .u-value')
    loss = page.locator('[data-testid="metric-chart"][data-metric="loss"] .u-value')
    # The training loss is 1/batches every 10 batches up to 100: its latest is 0.01.
    expect(accuracy).to_have_text(["latest", "0.9"])
    expect(loss).to_have_text(["latest", "0.01"])
    # Hovering the loss chart's middle: the batch there and the loss at it (1/batch).
    over = page.locator('[data-testid="metric-chart"][data-metric="loss"] .u-over')
    box = over.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    expect(loss.first).not_to_have_text("latest")
    cells = loss.all_inner_texts()
    batches, value = int(cells[0]), float(cells[1])
    assert 10 <= batches <= 100, cells
    assert value == pytest.approx(1 / batches, rel=1e-3), cells
    page.mouse.move(0, 0)
    expect(loss).to_have_text(["latest", "0.01"])
    page.context.close()


def test_the_checkpoint_table_fits_its_card_at_1440_pixels(first_look: tuple[Site, Data]) -> None:
    site, data = first_look
    page = _page(site, width=1440)
    page.goto(f"{site.base}/trials/{data.asha.trial_ids[2]}")
    expect(page.locator('[data-testid="checkpoint-row"]')).to_have_count(3)
    sizes = page.locator('[data-testid="checkpoints"]').evaluate(
        """(table) => {
            const card = table.closest('.panel');
            const wrap = table.closest('.table-wrap');
            return {table: table.scrollWidth, wrap: wrap.clientWidth,
                    right: table.getBoundingClientRect().right,
                    cardRight: card.getBoundingClientRect().right};
        }"""
    )
    assert sizes["table"] <= sizes["wrap"], sizes  # no scrolling sideways inside the card
    assert sizes["right"] <= sizes["cardRight"], sizes
    # Every metric of the checkpoint is there, and its download command to copy.
    row = page.locator('[data-testid="checkpoint-row"]').first
    for name in METRICS:
        expect(row).to_contain_text(name)
    command = row.locator('[data-testid="copy"]').get_attribute("title") or ""
    assert command.startswith("assay checkpoint download 22222222-"), command
    screenshot(page, "trial-checkpoints-1440")
    page.context.close()


def test_training_curves_are_drawn_beside_the_validation_markers_of_asha(
    first_look: tuple[Site, Data],
) -> None:
    site, data = first_look
    page = _page(site)
    page.goto(f"{site.base}/experiments/{data.asha.experiment_id}")
    # Five of seven trials validated once: markers; their training loss is a curve each.
    expect(page.locator('[data-testid="curves"][data-drawn="7"]')).to_be_visible()
    beside = page.locator('[data-testid="beside-curves"]')
    expect(beside).to_have_attribute("data-drawn", "7")
    expect(page.locator('[data-testid="beside-select"]')).to_have_value("loss")
    main_box = page.locator('[data-testid="curves"]').bounding_box()
    beside_box = beside.bounding_box()
    assert main_box is not None
    assert beside_box is not None
    assert beside_box["x"] >= main_box["x"] + main_box["width"]  # to its right
    screenshot(page, "experiment-asha-beside")
    # "nothing" hides them (kept in the address); a training metric chosen has none beside.
    page.locator('[data-testid="beside-select"]').select_option("none")
    expect(beside).to_have_count(0)
    assert parse_qs(urlparse(page.url).query)["beside"] == ["none"]
    page.goto(f"{site.base}/experiments/{data.asha.experiment_id}?metric=loss&group=training")
    expect(page.locator('[data-testid="curves"][data-drawn="7"]')).to_be_visible()
    expect(beside).to_have_count(0)
    expect(page.locator('[data-testid="beside-select"]')).to_have_count(0)
    page.context.close()


def _asked_states(page: Page, click: str) -> list[str]:
    """The states the list asks the master for after clicking the filter `click`."""
    with page.expect_request(
        lambda r: "/api/v1/experiments?" in r.url and "states=" in r.url
    ) as request:
        page.locator(f'[data-testid="filter-state"] button[data-state="{click}"]').click()
    return parse_qs(urlparse(request.value.url).query)["states"]


def test_state_filters_take_the_passing_states_with_where_they_lead(
    first_look: tuple[Site, Data],
) -> None:
    site, data = first_look
    page = _page(site)
    page.goto(site.base + "/")
    buttons = page.locator('[data-testid="filter-state"] button')
    expect(buttons).to_have_text(["active", "paused", "completed", "canceled", "error"])
    states = _asked_states(page, "canceled")
    assert sorted(states) == ["canceled", "stopping_canceled", "stopping_killed"], states
    assert parse_qs(urlparse(page.url).query)["state"] == ["canceled"]
    rows = page.locator('[data-testid="experiment-row"]')
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-id", str(data.canceled))
    # Another filter adds its own state; the active one is the experiment that waits.
    states = _asked_states(page, "active")
    assert sorted(states) == ["active", "canceled", "stopping_canceled", "stopping_killed"]
    expect(rows).to_have_count(2)
    # An address from before the grouping still filters by the state it names.
    page.goto(site.base + "/?state=stopping_canceled")
    expect(page.locator(".empty")).to_have_text("No experiments match these filters.")
    page.goto(site.base + "/?state=active")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-id", str(data.too_big))
    page.context.close()
