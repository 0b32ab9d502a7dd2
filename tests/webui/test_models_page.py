"""The model registry's pages in headless Chromium, against a real master serving a store
with one finished experiment whose first trial kept a checkpoint (tests/webui/seeding.py).

A model is created from the models page (a second of the same name is refused with the
master's reason); "Register" on the trial page's checkpoint makes it a version of that
model, and on the experiment page's best checkpoint a version of a model the dialog
creates; the model page shows each version's experiment, trial, metrics at the checkpoint
and notes, as the CLI does; archiving hides the model from the default list; a model that
does not exist is an error, not an empty page.

"Delete" on an experiment's page: refused, with the master's reason in the dialog, while a
model version of its workspace keeps one of its checkpoints; a second finished experiment
deleted from its page is gone from its project's list, and its page says so, while the
version of another workspace's model that named its checkpoint shows it was deleted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from playwright.sync_api import Browser, expect

from assay.master.store import Store
from tests.e2e.conftest import start_cluster, stop_cluster
from tests.webui.conftest import LONG, Site, screenshot
from tests.webui.seeding import SeededRun, seed_search

pytestmark = pytest.mark.slow

CHECKPOINT = "5a4b3c2d-1e0f-4a9b-8c7d-6e5f4a3b2c1d"
DOOMED_CHECKPOINT = "0d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6"


@dataclass
class Seeded:
    site: Site
    run: SeededRun
    # A second finished experiment, for "Delete".
    doomed: SeededRun


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
        doomed = seed_search(
            store,
            "doomed-search",
            {"global_batch_size": 32, "lr": 0.05},
            [({"global_batch_size": 32, "lr": 0.05}, [(100, 0.3), (200, 0.4)])],
            checkpoint=DOOMED_CHECKPOINT,
        )
    finally:
        store.close()
    cluster = start_cluster(tmp, None, agents=0, slots=0)
    try:
        site = Site(cluster, browser, run.experiment_id, run.trial_ids, tmp)
        site.keep_session()
        yield Seeded(site, run, doomed)
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
    # Who registered it, and whose code loading it runs.
    expect(v1.locator('[data-testid="version-registered-by"]')).to_contain_text("admin, ")
    expect(v1.locator('[data-testid="version-code-owner"]')).to_have_text("admin")
    expect(page.locator('[data-testid="model-about"]')).to_contain_text("workspace Default")
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


def test_delete_an_experiment(seeded: Seeded) -> None:
    """Refused while a model version keeps one of its checkpoints (the master's reason in
    the dialog, nothing gone); another finished experiment goes, and its page says so."""
    site = seeded.site
    kept, doomed = seeded.run.experiment_id, seeded.doomed.experiment_id
    guard = (
        ("model", "create", "delete-guard"),
        ("model", "register-version", "delete-guard", CHECKPOINT),
    )
    for args in guard:
        done = site.cluster.cli(*args)
        assert done.returncode == 0, done.stderr

    page = site.page()
    page.goto(f"{site.base}/experiments/{kept}")
    page.locator('[data-testid="delete-experiment"]').click()
    dialog = page.locator('[data-testid="delete-form"]')
    expect(dialog).to_contain_text(f"Delete experiment {kept} (registry-src)?")
    expect(dialog).to_contain_text("its 2 trials' metrics and logs and all its checkpoints")
    dialog.locator('[data-testid="delete-submit"]').click()
    error = dialog.locator('[data-testid="error"]')
    expect(error).to_contain_text(f"experiment {kept} cannot be deleted")
    expect(error).to_contain_text("model 'delete-guard' version 1")
    screenshot(page, "delete-experiment-refused")
    dialog.locator('[data-testid="delete-cancel"]').click()
    expect(dialog).to_have_count(0)
    page.goto(site.base + "/")
    expect(page.locator(f'[data-testid="experiment-row"][data-id="{kept}"]')).to_be_visible()
    expect(page.locator(f'[data-testid="experiment-row"][data-id="{doomed}"]')).to_be_visible()

    # A version of a model in another workspace does not keep its checkpoint.
    elsewhere = (
        ("workspace", "create", "elsewhere"),
        ("model", "create", "far", "--workspace", "elsewhere"),
        ("model", "register-version", "far", DOOMED_CHECKPOINT),
    )
    for step in elsewhere:
        done = site.cluster.cli(*step)
        assert done.returncode == 0, done.stderr
    page.goto(f"{site.base}/experiments/{doomed}")
    project = page.locator('[data-testid="experiment-project"]').inner_text()
    page.locator('[data-testid="delete-experiment"]').click()
    dialog = page.locator('[data-testid="delete-form"]')
    expect(dialog).to_contain_text(f"Delete experiment {doomed} (doomed-search)?")
    screenshot(page, "delete-experiment")
    dialog.locator('[data-testid="delete-submit"]').click()
    # To its project's list, where it is no more; the other stays.
    page.wait_for_url("**/workspaces/*/projects/*")
    expect(page.locator('[data-testid="project-name"]')).to_contain_text(project.split("/")[-1])
    expect(page.locator(f'[data-testid="experiment-row"][data-id="{kept}"]')).to_be_visible()
    expect(page.locator(f'[data-testid="experiment-row"][data-id="{doomed}"]')).to_have_count(0)
    page.goto(f"{site.base}/experiments/{doomed}")
    gone = page.locator('[data-testid="error"]')
    expect(gone).to_contain_text(f"experiment {doomed} does not exist")
    listed = site.cluster.cli("experiment", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert doomed not in [int(e["id"]) for e in json.loads(listed.stdout)]
    # That version stays, and says what happened to its checkpoint.
    page.goto(site.base + "/models/far")
    far = page.locator('[data-testid="version-row"][data-version="1"]')
    expect(far.locator('[data-testid="version-deleted"]')).to_have_text("deleted by its owner")
    expect(far).not_to_contain_text("assay model download")
    screenshot(page, "model-version-deleted")
    page.context.close()


def test_delete_is_for_ended_experiments_and_their_editors(seeded: Seeded) -> None:
    """Disabled, with the reason in its tooltip, while the experiment runs; hidden from a
    viewer of its workspace, and in `Default` from an editor who does not own it; shown
    to an admin of `Default`."""
    site = seeded.site
    running = site.submit(LONG)  # no agents: its trials wait, and it stays ACTIVE
    try:
        page = site.page()
        page.goto(f"{site.base}/experiments/{running}")
        expect(page.locator('[data-testid="experiment-state"]')).to_have_attribute(
            "data-state", "EXPERIMENT_STATE_ACTIVE"
        )
        button = page.locator('[data-testid="delete-experiment"]')
        expect(button).to_be_disabled()
        expect(page.locator("span[title]", has=button)).to_have_attribute(
            "title", "Only an ended experiment can be deleted: kill it or wait for its end"
        )
        page.context.close()
    finally:
        site.cluster.cli("experiment", "kill", str(running))

    cli = [sys.executable, "-m", "assay.cli.main", "-m", site.cluster.address]
    created = subprocess.run(
        [*cli, "user", "create", "vera", "--password-stdin"],
        input="vera-password\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert created.returncode == 0, created.stderr
    for role in ("viewer", "editor", "admin"):
        done = site.cluster.cli("workspace", "add-member", "Default", "vera", "--role", role)
        assert done.returncode == 0, done.stderr
        page = site.page(logged_in=False)
        page.goto(f"{site.base}/experiments/{seeded.run.experiment_id}")
        page.wait_for_url("**/login**")
        page.locator('[data-testid="login-username"]').fill("vera")
        page.locator('[data-testid="login-password"]').fill("vera-password")
        # The page asks the master for vera's role in the experiment's workspace.
        with page.expect_response(lambda r: r.url.endswith("/workspaces/Default")):
            page.locator('[data-testid="login-submit"]').click()
        expect(page.locator('[data-testid="fork-experiment"]')).to_be_visible()
        expect(page.locator('[data-testid="delete-experiment"]')).to_have_count(
            1 if role == "admin" else 0
        )
        page.context.close()
