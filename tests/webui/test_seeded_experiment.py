"""The experiment and trial pages of an adaptive ASHA search, in headless Chromium.

The search (tests/webui/seeding.py) is written into a store that a master serves: five of
its seven trials stopped at the first rung with a single validation, `lr` is searched on
a log scale, the training loss reaches 0 and below, one checkpoint was kept. Every trial
is drawn (a single validation as a marker, found by its colour on the canvas); log axes
are ticked at round positive values in one notation, from about the data's least
positive value, and no point is cut by the plot's edge; the counts read in the singular
where they are one; ordinary log lines have a blank level; the progress label is centred;
"Fork" submits the edited config with the search's model definition.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from playwright.sync_api import Browser, Page, expect

from assay.master.store import Store
from tests.e2e.conftest import start_cluster, stop_cluster
from tests.webui.conftest import Site, screenshot
from tests.webui.seeding import MODEL_DEF_SOURCE, Seeded, seed_asha

pytestmark = pytest.mark.slow

# The curves' colours of the first trials, in trial order (webui/src/components/Plot.tsx).
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2"]
# The trial page's validation series (webui/src/components/TrialCharts.tsx).
VALIDATION_COLOUR = "#ff7f0e"

# Pixels of the canvases under `root` within `tol` of the colour `hex` on every channel.
_PIXELS_OF = """(root, [hex, tol]) => {
    const want = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
    let count = 0;
    for (const canvas of root.querySelectorAll('canvas')) {
        const ctx = canvas.getContext('2d');
        if (!ctx || canvas.width === 0 || canvas.height === 0) continue;
        const data = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
        for (let i = 0; i < data.length; i += 4) {
            if (data[i + 3] > 200 && Math.abs(data[i] - want[0]) <= tol
                && Math.abs(data[i + 1] - want[1]) <= tol
                && Math.abs(data[i + 2] - want[2]) <= tol) count++;
        }
    }
    return count;
}"""

# The label's text box's centre minus its bar's centre, in CSS pixels: [dx, dy].
_OFF_CENTRE = """(bar) => {
    const range = document.createRange();
    range.selectNodeContents(bar.querySelector('.progress-text'));
    const t = range.getBoundingClientRect();
    const b = bar.getBoundingClientRect();
    return [(t.left + t.right - b.left - b.right) / 2, (t.top + t.bottom - b.top - b.bottom) / 2];
}"""


@pytest.fixture(scope="module")
def seeded(
    browser: Browser, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Site, Seeded]]:
    tmp = tmp_path_factory.mktemp("webui-seeded")
    (tmp / "master").mkdir()
    store = Store.open(f"sqlite:///{tmp / 'master' / 'assay.db'}")
    try:
        seeded = seed_asha(store)
    finally:
        store.close()
    cluster = start_cluster(tmp, None, agents=0, slots=0)
    try:
        site = Site(cluster, browser, seeded.experiment_id, seeded.trial_ids, tmp)
        site.keep_session()
        yield site, seeded
    finally:
        stop_cluster(cluster)


def _drawn(page: Page, testid: str = "curves") -> int:
    chart = page.locator(f'[data-testid="{testid}"][data-drawn]')
    chart.wait_for()
    return int(chart.get_attribute("data-drawn") or "-1")


def _labels(page: Page, selector: str, attribute: str) -> list[str]:
    element = page.locator(f"{selector}[{attribute}]")
    element.wait_for()
    labels: list[str] = json.loads(element.get_attribute(attribute) or "[]")
    return labels


def _assert_round_log_ticks(labels: list[str], least: float, most: float) -> None:
    """Two or more round positive ticks in one notation, about the data's extent."""
    assert len(labels) >= 2, labels
    assert "0" not in labels, labels
    assert len({"e" in label for label in labels}) == 1, f"two notations: {labels}"
    values = [float(label) for label in labels]
    assert all(v > 0 for v in values), labels
    assert values == sorted(values), labels
    for v in values:
        mantissa = v / 10 ** math.floor(math.log10(v) + 1e-12)
        assert abs(mantissa - round(mantissa)) < 1e-9, f"{v} is not round: {labels}"
    assert least / 10 <= values[0] <= least * 10, f"starts far from {least}: {labels}"
    assert most / 10 <= values[-1] <= most * 10, f"ends far from {most}: {labels}"


def test_every_trial_is_drawn_even_with_a_single_validation(
    seeded: tuple[Site, Seeded],
) -> None:
    site, data = seeded
    page = site.page()
    # The searcher's metric, as the page opens by default.
    page.goto(f"{site.base}/experiments/{data.experiment_id}")
    assert _drawn(page) == len(data.trial_ids) == 7
    screenshot(page, "experiment-asha")
    curves = page.locator('[data-testid="curves"]')
    for i, colour in enumerate(PALETTE):
        pixels = int(curves.evaluate(_PIXELS_OF, [colour, 6]))
        assert pixels >= 12, f"trial {data.trial_ids[i]} ({colour}) is not drawn: {pixels} pixels"
    # The trial's own page: its one validation is a marker in the validation colour.
    page.goto(f"{site.base}/trials/{data.trial_ids[0]}")
    assert _drawn(page, "trial-charts") == 2  # training loss, validation accuracy
    charts = page.locator('[data-testid="trial-charts"]')
    pixels = int(charts.evaluate(_PIXELS_OF, [VALIDATION_COLOUR, 6]))
    assert pixels >= 12, f"the single validation is not drawn: {pixels} pixels"
    page.context.close()


def test_log_axes_are_ticked_at_round_values_from_the_least_positive_one(
    seeded: tuple[Site, Seeded],
) -> None:
    site, data = seeded
    page = site.page()
    page.goto(f"{site.base}/experiments/{data.experiment_id}")
    least, most = min(data.lrs), max(data.lrs)
    lr_scatter = '[data-testid="scatter"][data-name="lr"]'
    _assert_round_log_ticks(_labels(page, lr_scatter, "data-x-ticks"), least, most)
    parallel = page.locator('[data-testid="pcoords"][data-ticks]').get_attribute("data-ticks")
    _assert_round_log_ticks(json.loads(parallel or "{}")["lr"], least, most)
    # Every point whole: its centre at least a marker's radius (3 px) and its edge (1 px)
    # inside the plotting area.
    for name in ("lr", "dropout"):
        gap = page.locator(f'[data-testid="scatter"][data-name="{name}"][data-edge-gap]')
        assert int(gap.get_attribute("data-edge-gap") or "-1") >= 4, name

    # Learning curves on a log scale: the loss reaches 0 and below, the axis starts at its
    # least positive value (1/898, two batches before the longest trial's end).
    page.goto(f"{site.base}/experiments/{data.experiment_id}?metric=loss&group=training&log=1")
    assert _drawn(page) == 7
    labels = _labels(page, '[data-testid="curves"]', "data-y-ticks")
    _assert_round_log_ticks(labels, 1 / 898, 1.0)
    screenshot(page, "experiment-asha-log")
    page.context.close()


def test_counts_of_one_read_in_the_singular(seeded: tuple[Site, Seeded]) -> None:
    site, data = seeded
    page = site.page()
    page.goto(f"{site.base}/experiments/{data.experiment_id}")
    expect(page.locator('[data-testid="best-checkpoint"]')).to_contain_text(data.checkpoint)
    expect(page.locator('[data-testid="checkpoint-count"]')).to_have_text(
        "1 checkpoint in this experiment."
    )
    # The master's slots, none here: "0/0 slots free".
    expect(page.locator('[data-testid="slots-free"]')).to_have_text("0/0 slots free")
    page.context.close()


def test_ordinary_log_lines_have_a_blank_level(seeded: tuple[Site, Seeded]) -> None:
    site, data = seeded
    page = site.page()
    page.goto(f"{site.base}/trials/{data.trial_ids[0]}")
    lines = page.locator('[data-testid="log-line"]')
    expect(lines).to_have_count(4)
    expect(page.locator('[data-testid="log-status"]')).to_contain_text("4 lines")
    levels = {
        line.locator(".log-msg").inner_text(): line.locator(".log-level").inner_text()
        for line in lines.all()
    }
    assert levels == {
        "epoch 1: loss 0.51": "",
        "epoch 2: loss 0.33": "",
        "WARNING: the learning rate is large": "WARNING",
        "INFO: saved a checkpoint": "INFO",
    }
    page.locator('[data-testid="log-search"]').fill("epoch 2")
    expect(page.locator('[data-testid="log-status"]')).to_contain_text("1 of 4 lines")
    page.context.close()


def test_the_progress_label_is_centred(seeded: tuple[Site, Seeded]) -> None:
    site, data = seeded
    page = site.page()
    for path in (f"/experiments/{data.experiment_id}", "/"):
        page.goto(site.base + path)
        bar = page.locator('[data-testid="progress"]').first
        expect(bar).to_contain_text("100%")
        dx, dy = bar.evaluate(_OFF_CENTRE)
        off = f"{path}: the label is {dx:.1f}, {dy:.1f} px off centre"
        assert abs(dx) <= 1.5, off
        assert abs(dy) <= 1.5, off
    page.context.close()


def test_fork_submits_the_edited_config_with_the_same_model_definition(
    seeded: tuple[Site, Seeded], tmp_path: Path
) -> None:
    """ "Fork" opens the config as YAML; a config the master refuses says why in the
    dialog and creates nothing; an edited one becomes a new experiment, shown at once,
    whose model definition is the source's. (Last in the module: the fork is the newest
    experiment.)"""
    site, data = seeded
    page = site.page()
    page.goto(f"{site.base}/experiments/{data.experiment_id}")
    page.locator('[data-testid="fork-experiment"]').click()
    editor = page.locator('[data-testid="fork-config"]')
    expect(editor).to_be_focused()
    config = yaml.safe_load(editor.input_value())
    assert config["name"] == "asha-rungs"
    assert config["searcher"]["max_trials"] == 7
    before = site.cluster.json("experiment", "list", "--all")
    editor.fill(yaml.safe_dump({**config, "searcher": {**config["searcher"], "name": "nope"}}))
    page.locator('[data-testid="fork-submit"]').click()
    expect(page.locator('[data-testid="fork-form"] .error-panel')).to_contain_text("searcher.name")
    assert site.cluster.json("experiment", "list", "--all") == before

    config["name"] = "asha-fork"
    config["searcher"]["max_trials"] = 2
    editor.fill(yaml.safe_dump(config))
    page.locator('[data-testid="fork-submit"]').click()
    expect(page.locator("h1")).to_contain_text("asha-fork")
    fork_id = int(page.url.rstrip("/").rsplit("/", 1)[-1])
    try:
        assert fork_id != data.experiment_id
        described = site.cluster.json("experiment", "describe", str(fork_id))
        assert described["config"]["searcher"]["max_trials"] == 2
        code = tmp_path / "m"
        got = site.cluster.cli("experiment", "download-model-def", str(fork_id), str(code))
        assert got.returncode == 0, got.stderr
        assert (code / "model_def.py").read_bytes() == MODEL_DEF_SOURCE
        screenshot(page, "fork")
    finally:
        site.cluster.cli("experiment", "kill", str(fork_id))
        page.context.close()
