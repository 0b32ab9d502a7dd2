"""The model registry's pages in headless Chromium, against a real master serving a store
with one finished experiment whose first trial kept a checkpoint (tests/webui/seeding.py).

A model is created from the models page (a second of the same name is refused with the
master's reason); "Register" on the trial page's checkpoint makes it a version of that
model, and on the experiment page's best checkpoint a version of a model the dialog
creates; the model page shows each version's experiment, trial, metrics at the checkpoint
and notes, as the CLI does; archiving hides the model from the default list; a model that
does not exist is an error, not an empty page.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from playwright.sync_api import Browser, expect

from assay.master.store import Store
from tests.e2e.conftest import start_cluster, stop_cluster
from tests.webui.conftest import Site, screenshot
from tests.webui.seeding import SeededRun, seed_search

pytestmark = pytest.mark.slow

CHECKPOINT = "5a4b3c2d-1e0f-4a9b-8c7d-6e5f4a3b2c1d"


@dataclass
class Seeded:
    site: Site
    run: SeededRun


@pytest.fixture(scope="module")
def seeded(browser: Browser, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    tmp = tmp_path_factory.mktemp("webui-models")
    (tmp / "master").mkdir()
    store = Store.open(f"sqlite:///{tmp / 'master' / 'assay.db'}")
    try:
        run = seed_search(
            store,
            "registry-src",
            {"global_batch_size": 32, "lr": {"type": "double", "minval": 0.001, "maxval": 0.1}},
            [
                ({"global_batch_size": 32, "lr": 0.02}, [(100, 0.61), (200, 0.82)]),
                ({"global_batch_size": 32, "lr": 0.07}, [(100, 0.41), (200, 0.52)]),
            ],
            checkpoint=CHECKPOINT,
        )
    finally:
        store.close()
    cluster = start_cluster(tmp, None, agents=0, slots=0)
    try:
        site = Site(cluster, browser, run.experiment_id, run.trial_ids, tmp)
        site.keep_session()
        yield Seeded(site, run)
    finally:
        stop_cluster(cluster)


def _cli_versions(site: Site, name: str) -> list[dict[str, object]]:
    done = site.cluster.cli("model", "versions", name, "--json")
    assert done.returncode == 0, done.stderr
    versions: list[dict[str, object]] = json.loads(done.stdout)
    return versions


def test_create_register_and_show_versions(seeded: Seeded) -> None:
    site = seeded.site
    trial_id = seeded.run.trial_ids[0]
    page = site.page()
    page.goto(site.base + "/models")
    expect(page.locator('[data-testid="models"]')).to_contain_text("No models yet")

    form = page.locator('[data-testid="model-new"]')
    form.locator('[data-testid="model-new-name"]').fill("digits-cnn")
    form.locator('[data-testid="model-new-description"]').fill("the digits classifier")
    form.locator('[data-testid="model-new-submit"]').click()
    expect(form.locator('[data-testid="model-new-message"]')).to_contain_text("digits-cnn")
    row = page.locator('[data-testid="model-row"][data-name="digits-cnn"]')
    expect(row).to_contain_text("the digits classifier")
    expect(row.locator('[data-testid="model-versions"]')).to_have_text("0")
    # The master's refusal, as it gave it; nothing else changes.
    form.locator('[data-testid="model-new-name"]').fill("digits-cnn")
    form.locator('[data-testid="model-new-submit"]').click()
    expect(form.locator('[data-testid="error"]')).to_contain_text("exists already")
    expect(page.locator('[data-testid="model-row"]')).to_have_count(1)

    # "Register" on the trial's checkpoint: an empty name is refused in the dialog.
    page.goto(f"{site.base}/trials/{trial_id}")
    checkpoint = page.locator(f'[data-testid="checkpoint-row"][data-uuid="{CHECKPOINT}"]')
    checkpoint.locator('[data-testid="register-checkpoint"]').click()
    dialog = page.locator('[data-testid="register-form"]')
    dialog.locator('[data-testid="register-submit"]').click()
    expect(dialog.locator('[data-testid="error"]')).to_contain_text("Enter the name of a model")
    dialog.locator('[data-testid="register-model"]').fill("digits-cnn")
    dialog.locator('[data-testid="register-notes"]').fill("best of the first search")
    screenshot(page, "register-dialog")
    dialog.locator('[data-testid="register-submit"]').click()
    expect(dialog).to_have_count(0)
    expect(checkpoint.locator('[data-testid="register-done"]')).to_have_text("digits-cnn v1")
    (version,) = _cli_versions(site, "digits-cnn")
    assert version["checkpoint_uuid"] == CHECKPOINT
    assert version["notes"] == "best of the first search"

    # From the experiment's best checkpoint, into a model the dialog creates.
    page.goto(f"{site.base}/experiments/{seeded.run.experiment_id}")
    best = page.locator('[data-testid="best-checkpoint"]')
    best.locator('[data-testid="register-checkpoint"]').click()
    page.locator('[data-testid="register-model"]').fill("registry-best")
    page.locator('[data-testid="register-submit"]').click()
    expect(best.locator('[data-testid="register-done"]')).to_have_text("registry-best v1")
    best.locator('[data-testid="register-done"] a').click()
    page.wait_for_url("**/models/registry-best")
    expect(page.locator('[data-testid="version-row"]')).to_have_count(1)

    # The model page: where each version came from, its metrics there, its notes.
    page.goto(site.base + "/models/digits-cnn")
    v1 = page.locator('[data-testid="version-row"][data-version="1"]')
    expect(v1.locator('[data-testid="version-from"]')).to_have_text(
        f"experiment {seeded.run.experiment_id} · trial {trial_id}"
    )
    expect(v1.locator('[data-testid="version-metrics"]')).to_have_text("accuracy 0.82")
    expect(v1.locator('[data-testid="version-notes"]')).to_have_text("best of the first search")
    screenshot(page, "model")

    # Archived: out of the default list, in "Archived only".
    page.locator('[data-testid="model-archive"]').click()
    expect(page.locator('[data-testid="model-unarchive"]')).to_be_visible()
    page.goto(site.base + "/models")
    expect(page.locator('[data-testid="model-row"]')).to_have_count(1)
    expect(page.locator('[data-testid="model-row"][data-name="registry-best"]')).to_be_visible()
    page.locator('[data-testid="models-filter-archived"]').select_option("only")
    expect(page.locator('[data-testid="model-row"][data-name="digits-cnn"]')).to_be_visible()
    expect(page.locator('[data-testid="model-row"]')).to_have_count(1)
    screenshot(page, "models")
    page.context.close()


def test_a_missing_model_is_an_error(seeded: Seeded) -> None:
    page = seeded.site.page()
    page.goto(seeded.site.base + "/models/no-such-model")
    expect(page.locator('[data-testid="error"]')).to_contain_text("no-such-model")
    expect(page.locator('[data-testid="error"]')).to_contain_text("404")
    page.context.close()
