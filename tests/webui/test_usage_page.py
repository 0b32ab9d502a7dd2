"""The usage page and an experiment's slot-hours in headless Chromium, against a real
master and agent that ran a short experiment."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml
from playwright.sync_api import Browser, expect

from tests.conftest import REGRESSION_DIR, regression_config
from tests.e2e.conftest import start_cluster, stop_cluster
from tests.webui.conftest import Site, screenshot, wait_state

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def used(browser: Browser, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    tmp = tmp_path_factory.mktemp("usage-page")
    cluster = start_cluster(tmp, None, agents=1, slots=1)
    try:
        site = Site(cluster, browser, 0, [], tmp)
        site.keep_session()
        path = tmp / "config.yaml"
        path.write_text(yaml.safe_dump(regression_config(batches=40)))
        created = cluster.json("experiment", "create", str(path), str(REGRESSION_DIR))
        site.experiment_id = int(created["id"])
        wait_state(site, site.experiment_id, {"COMPLETED"}, timeout=120)
        yield site
    finally:
        stop_cluster(cluster)


def test_the_usage_page_charts_slot_hours_by_user_and_pool(used: Site) -> None:
    page = used.page()
    page.goto(used.base + "/")
    page.locator('[data-testid="nav-usage"]').click()
    page.wait_for_url("**/usage")
    expect(page.locator('[data-testid="usage-scope"]')).to_contain_text("every user's")
    by_user = page.locator('[data-testid="usage-by-user"]')
    expect(by_user).to_have_attribute("data-series", '["admin"]')
    expect(by_user.locator("canvas")).to_have_count(1)
    expect(page.locator('[data-testid="usage-by-pool"]')).to_have_attribute(
        "data-series", '["default"]'
    )
    hours = page.locator(
        '[data-testid="usage-users-row"][data-key="admin"] [data-testid="slot-hours"]'
    )
    assert float(hours.inner_text()) > 0
    pools = page.locator('[data-testid="usage-pools"]')
    expect(pools.locator('tr[data-key="default"]')).to_be_visible()
    screenshot(page, "usage")
    # Another window asks again, and the URL keeps it.
    page.locator('[data-testid="usage-window"]').select_option("7")
    page.wait_for_url("**/usage?days=7")
    expect(by_user).to_have_attribute("data-series", '["admin"]')


def test_the_experiment_page_shows_its_slot_hours(used: Site) -> None:
    described = used.describe(used.experiment_id)
    assert described["slot_hours"] > 0
    page = used.page()
    page.goto(f"{used.base}/experiments/{used.experiment_id}")
    shown = page.locator('[data-testid="experiment-slot-hours"]')
    expect(shown).not_to_have_text("\u2013")  # the dash shown to others
    assert float(shown.inner_text()) == pytest.approx(described["slot_hours"], rel=0.01, abs=1e-4)
