"""Workspace and project pages in headless Chromium, against a real master serving a store
with an experiment in the Default workspace and one in the "digits" project of a
"vision" workspace (tests/webui/seeding.py).

The workspaces list shows both with the user's role and counts; a workspace's page lists
its projects and members and creates a project (a second of the same name is refused with
the master's reason); a project's page lists its experiments only, with the list's columns
and picks; names that do not exist are errors.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from playwright.sync_api import Browser, expect

from assay.master.store import Store
from tests.e2e.conftest import start_cluster, stop_cluster
from tests.webui.conftest import Site, screenshot
from tests.webui.seeding import SeededRun, seed_search

pytestmark = pytest.mark.slow

ONE_TRIAL = [({"global_batch_size": 32, "lr": 0.01}, [(100, 0.5), (200, 0.6)])]


@dataclass
class Seeded:
    site: Site
    default: SeededRun
    digits: SeededRun


@pytest.fixture(scope="module")
def seeded(browser: Browser, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    tmp = tmp_path_factory.mktemp("webui-workspaces")
    (tmp / "master").mkdir()
    store = Store.open(f"sqlite:///{tmp / 'master' / 'assay.db'}")
    try:
        workspace = store.create_workspace("vision", store.user_id("admin"))
        project = store.create_project(workspace.id, "digits", "the digits CNN")
        hps = {"global_batch_size": 32, "lr": 0.01}
        default = seed_search(store, "in-default", hps, ONE_TRIAL)
        digits = seed_search(store, "in-digits", hps, ONE_TRIAL, project_id=project.id)
    finally:
        store.close()
    cluster = start_cluster(tmp, None, agents=0, slots=0)
    try:
        site = Site(cluster, browser, digits.experiment_id, digits.trial_ids, tmp)
        site.keep_session()
        yield Seeded(site, default, digits)
    finally:
        stop_cluster(cluster)


def test_workspaces_projects_and_a_project_s_experiments(seeded: Seeded) -> None:
    site = seeded.site
    page = site.page()
    page.goto(site.base + "/")
    page.locator('[data-testid="nav-workspaces"]').click()
    vision = page.locator('[data-testid="workspace-row"][data-name="vision"]')
    expect(vision.locator('[data-testid="workspace-role"]')).to_have_text("admin")
    expect(vision.locator('[data-testid="workspace-experiments"]')).to_have_text("1")
    expect(page.locator('[data-testid="workspace-row"][data-name="Default"]')).to_be_visible()
    screenshot(page, "workspaces")

    vision.locator("a").click()
    page.wait_for_url("**/workspaces/vision")
    digits = page.locator('[data-testid="project-row"][data-name="digits"]')
    expect(digits).to_contain_text("the digits CNN")
    expect(digits.locator('[data-testid="project-experiments"]')).to_have_text("1")
    expect(page.locator('[data-testid="member-row"][data-username="admin"]')).to_contain_text(
        "admin"
    )

    form = page.locator('[data-testid="project-new"]')
    form.locator('[data-testid="project-new-name"]').fill("audio")
    form.locator('[data-testid="project-new-description"]').fill("speech models")
    form.locator('[data-testid="project-new-submit"]').click()
    expect(page.locator('[data-testid="project-row"][data-name="audio"]')).to_contain_text(
        "speech models"
    )
    form.locator('[data-testid="project-new-name"]').fill("audio")
    form.locator('[data-testid="project-new-submit"]').click()
    expect(form.locator('[data-testid="error"]')).to_contain_text("audio")
    expect(page.locator('[data-testid="project-row"]')).to_have_count(2)
    done = site.cluster.cli("project", "list", "vision")
    assert done.returncode == 0, done.stderr
    assert "audio" in done.stdout
    screenshot(page, "workspace")

    # The project's page: its experiments only.
    digits.locator("a").click()
    page.wait_for_url("**/workspaces/vision/projects/digits")
    rows = page.locator('[data-testid="experiment-row"]')
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-id", str(seeded.digits.experiment_id))
    expect(rows.first.locator('td[data-column="project"]')).to_have_text("vision/digits")
    screenshot(page, "project")
    rows.first.locator('td[data-column="name"] a').click()
    expect(page.locator('[data-testid="experiment-project"]')).to_have_text("vision/digits")
    page.locator('[data-testid="experiment-project"] a').click()
    page.wait_for_url("**/workspaces/vision/projects/digits")

    # The whole list has both, each with its project.
    page.goto(site.base + "/")
    expect(rows).to_have_count(2)
    default_row = page.locator(
        f'[data-testid="experiment-row"][data-id="{seeded.default.experiment_id}"]'
    )
    expect(default_row.locator('td[data-column="project"]')).to_have_text("Default/Uncategorized")
    page.context.close()


def test_unknown_workspace_and_project_say_so(seeded: Seeded) -> None:
    page = seeded.site.page()
    page.goto(seeded.site.base + "/workspaces/nowhere")
    expect(page.locator('[data-testid="error"]')).to_contain_text("nowhere")
    page.goto(seeded.site.base + "/workspaces/vision/projects/nothing")
    expect(page.locator('[data-testid="error"]')).to_contain_text("nothing")
    expect(page.locator('[data-testid="experiment-row"]')).to_have_count(0)
    page.context.close()
