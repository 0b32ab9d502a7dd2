"""Every page of the web UI in headless Chromium, against a real master and agent.

The experiment list shows the finished search; its page draws every trial's curve in
colour (pixels of the canvas are read back); the trial page shows the trial's log lines; a
click on pause changes the experiment's state in the store and the page follows without a
reload; every route survives a reload and a direct visit; unknown ids and routes say so.
Nothing is shown before logging in, and logging out ends the session at the master.
"""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import Page, expect

from assay.master.store import Store
from tests.webui.conftest import LONG, Site, screenshot, wait_state

pytestmark = pytest.mark.slow

# Pixels of a canvas drawn in colour (a series), not grey (grid, axes, text): counted in
# the page, so that nothing but a number crosses over.
_COLOURED_PIXELS = """(root) => {
    let count = 0;
    for (const canvas of root.querySelectorAll('canvas')) {
        const ctx = canvas.getContext('2d');
        if (!ctx || canvas.width === 0 || canvas.height === 0) continue;
        const data = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
        for (let i = 0; i < data.length; i += 4) {
            const [r, g, b, a] = [data[i], data[i + 1], data[i + 2], data[i + 3]];
            if (a > 128 && Math.max(r, g, b) - Math.min(r, g, b) > 60) count++;
        }
    }
    return count;
}"""


def _drawn(page: Page, testid: str) -> int:
    """Wait for the charts under `testid` to say they drew; the number of series drawn."""
    chart = page.locator(f'[data-testid="{testid}"][data-drawn]')
    chart.wait_for()
    drawn = chart.get_attribute("data-drawn")
    assert drawn is not None
    return int(drawn)


def _coloured(page: Page, testid: str) -> int:
    count = page.locator(f'[data-testid="{testid}"]').evaluate(_COLOURED_PIXELS)
    return int(count)


def test_the_list_shows_the_experiment(site: Site) -> None:
    page = site.page()
    page.goto(site.base + "/")
    row = page.locator(f'[data-testid="experiment-row"][data-id="{site.experiment_id}"]')
    expect(row).to_be_visible()
    expect(row).to_contain_text("digits-web")
    expect(row.locator('[data-testid="experiment-state"]')).to_contain_text(
        re.compile("completed", re.IGNORECASE)
    )
    expect(row).to_contain_text("random")  # the searcher
    screenshot(page, "experiments")
    # Filtering by name is in the URL, and a reload keeps it.
    page.goto(site.base + "/?name=no-such-name")
    expect(row).to_have_count(0)
    page.reload()
    expect(row).to_have_count(0)
    page.goto(site.base + "/?name=digits-web")
    expect(row).to_be_visible()
    page.context.close()


def test_the_experiment_page_draws_every_trials_curve(site: Site) -> None:
    page = site.page()
    page.goto(f"{site.base}/experiments/{site.experiment_id}")
    assert _drawn(page, "curves") == len(site.trial_ids) == 3
    assert _coloured(page, "curves") > 200, "the curves' canvas holds no coloured line"
    rows = page.locator('[data-testid="trial-row"]')
    expect(rows).to_have_count(3)
    for trial_id in site.trial_ids:
        expect(page.locator(f'[data-testid="trial-row"][data-id="{trial_id}"]')).to_be_visible()
    expect(page.locator('[data-testid="config"]')).to_contain_text("model_def:DigitsTrial")
    expect(page.locator('[data-testid="hparams"]')).to_be_visible()
    screenshot(page, "experiment")
    page.reload()
    assert _drawn(page, "curves") == 3
    page.context.close()


def test_the_trial_page_shows_charts_and_log_lines(site: Site) -> None:
    page = site.page()
    trial_id = site.trial_ids[0]
    page.goto(f"{site.base}/trials/{trial_id}")
    lines = page.locator('[data-testid="log-line"]')
    expect(lines.first).to_be_visible()
    assert lines.count() >= 3
    # The master writes each run's start into the trial's log.
    expect(page.locator('[data-testid="log-line"]', has_text="run 1")).not_to_have_count(0)
    assert _drawn(page, "trial-charts") >= 1
    assert _coloured(page, "trial-charts") > 100
    expect(page.locator('[data-testid="checkpoint-row"]').first).to_be_visible()
    screenshot(page, "trial")
    # The search box narrows the lines to those that match.
    total = lines.count()
    page.locator('[data-testid="log-search"]').fill("run 1")
    expect(lines.first).to_contain_text("run 1")
    assert lines.count() < total
    page.reload()
    expect(page.locator('[data-testid="log-line"]').first).to_be_visible()
    page.context.close()


def test_the_cluster_page_lists_the_agent(site: Site) -> None:
    page = site.page()
    page.goto(site.base + "/cluster")
    row = page.locator('[data-testid="agent-row"][data-id="agent0"]')
    expect(row).to_be_visible()
    expect(page.locator('[data-testid="queue"]')).to_be_visible()
    screenshot(page, "cluster")
    page.reload()
    expect(row).to_be_visible()
    page.context.close()


def test_the_cluster_page_shows_the_pools_and_each_agents_pool(site: Site) -> None:
    page = site.page()
    page.goto(site.base + "/cluster")
    agent = page.locator('[data-testid="agent-row"][data-id="agent0"]')
    expect(agent.locator('[data-testid="agent-pool"]')).to_have_text("pool default")
    pool = page.locator('[data-testid="pool-row"][data-id="default"]')
    expect(pool).to_contain_text("default (default)")
    expect(pool).to_contain_text("priority")
    expect(pool.locator('[data-testid="pool-slots"]')).to_contain_text("/ 2 CPU busy")
    page.context.close()


def test_a_pause_click_changes_the_store_and_the_page_follows(site: Site) -> None:
    experiment_id = site.submit(LONG)
    wait_state(site, experiment_id, {"ACTIVE"})
    page = site.page()
    page.goto(f"{site.base}/experiments/{experiment_id}")
    state = page.locator('[data-testid="experiment-state"]').first
    expect(state).to_contain_text(re.compile("active", re.IGNORECASE))
    page.locator('[data-testid="action-pause"]').first.click()
    store = Store.open(f"sqlite:///{site.cluster.state_dir / 'assay.db'}")
    try:
        deadline = time.monotonic() + 30
        while store.get_experiment(experiment_id).state != "PAUSED":
            assert time.monotonic() < deadline, "the click did not pause the experiment"
            time.sleep(0.2)
    finally:
        store.close()
    expect(state).to_contain_text(re.compile("paused", re.IGNORECASE), timeout=10_000)
    screenshot(page, "experiment-paused")
    # A change made elsewhere (the CLI) reaches the open page without a reload.
    killed = site.cluster.cli("experiment", "kill", str(experiment_id))
    assert killed.returncode == 0, killed.stderr
    expect(state).to_contain_text(re.compile("cancel|kill", re.IGNORECASE), timeout=10_000)
    page.context.close()


def test_a_running_trial_shows_each_ranks_utilisation(site: Site) -> None:
    experiment_id = site.submit(LONG)
    try:
        wait_state(site, experiment_id, {"ACTIVE"})
        deadline = time.monotonic() + 60
        running: list[dict[str, object]] = []
        while not running:
            assert time.monotonic() < deadline, "no trial started"
            trials = site.describe(experiment_id)["trials"]
            running = [t for t in trials if t["state"] == "RUNNING"]
            time.sleep(0.5)
        page = site.page()
        page.goto(f"{site.base}/trials/{running[0]['id']}")
        # The agent's next heartbeat (every 5 s) carries the rank's sample.
        row = page.locator('[data-testid="rank-usage-row"]')
        expect(row).to_have_count(1, timeout=30_000)
        cells = row.locator("td")
        expect(cells.nth(0)).to_have_text("0")  # rank
        expect(cells.nth(1)).to_have_text("agent0")
        expect(cells.nth(3)).to_have_text(re.compile(r"^\d+%$"))  # CPU
        expect(cells.nth(4)).to_have_text(re.compile(r"MiB|GiB"))  # resident memory
        screenshot(page, "trial-rank-usage")
        page.context.close()
    finally:
        site.cluster.cli("experiment", "kill", str(experiment_id))


def test_unknown_ids_and_routes_say_so(site: Site) -> None:
    page = site.page()
    page.goto(site.base + "/experiments/987654")
    expect(page.locator('[data-testid="error"]')).to_contain_text("987654")
    page.goto(site.base + "/trials/987654")
    expect(page.locator('[data-testid="error"]')).to_contain_text("987654")
    page.goto(site.base + "/no/such/page")
    expect(page.locator('[data-testid="not-found"]')).to_be_visible()
    screenshot(page, "not-found")
    page.context.close()


def test_the_page_loads_nothing_from_another_host(site: Site) -> None:
    """The cluster may have no internet: every request the pages make is to the master."""
    page = site.page()
    hosts: set[str] = set()
    page.on("request", lambda request: hosts.add(request.url.split("/")[2]))
    for path in ("/", f"/experiments/{site.experiment_id}", f"/trials/{site.trial_ids[0]}"):
        page.goto(site.base + path)
        page.wait_for_load_state("networkidle")
    assert hosts == {f"127.0.0.1:{site.cluster.http_port}"}
    page.context.close()


def test_nothing_is_shown_before_logging_in(site: Site) -> None:
    page = site.page(logged_in=False)
    page.goto(f"{site.base}/experiments/{site.experiment_id}")
    page.wait_for_url(re.compile(r"/login\?next="))
    expect(page.locator('[data-testid="curves"]')).to_have_count(0)
    site.log_in(page, password="not-the-password")
    expect(page.locator('[data-testid="login-error"]')).to_contain_text(
        "wrong username or password"
    )
    screenshot(page, "login")
    site.log_in(page)
    # Back where the visit began.
    page.wait_for_url(re.compile(rf"/experiments/{site.experiment_id}"))
    assert _drawn(page, "curves") == 3
    expect(page.locator('[data-testid="current-user"]')).to_contain_text("admin")
    token = page.evaluate("localStorage.getItem('assay.token')")
    assert token.startswith("ast_")
    page.locator('[data-testid="logout"]').click()
    page.wait_for_url(re.compile("/login"))
    # The master no longer takes that token.
    status = page.evaluate(
        """async (token) => (await fetch('/api/v1/me',
            {headers: {Authorization: 'Bearer ' + token}})).status""",
        token,
    )
    assert status == 401
    page.context.close()


def test_a_trial_the_cluster_cannot_hold_says_why_and_the_config_reads_as_submitted(
    site: Site,
) -> None:
    # The cluster has one agent with 2 slots; this asks for 4, with a comment and a secret.
    config = (
        LONG.replace("name: digits-long", "name: digits-too-big")
        .replace("global_batch_size: 32", "global_batch_size: 32  # per step, over all slots")
        .replace(
            "searcher:", "resources: {slots_per_trial: 4}\ndata:\n  api_token: hunter2\nsearcher:"
        )
    )
    experiment_id = site.submit(config)
    try:
        page = site.page()
        page.goto(site.base + "/cluster")
        reason = page.locator('[data-testid="queue-row"] [data-testid="queue-reason"]')
        expect(reason.first).to_have_text(
            "cannot start: needs 4 CPU slots; the cluster has 2 (1 agent)"
        )
        expect(reason.first).to_have_attribute("data-kind", "too_large")
        position = page.locator('[data-testid="queue-row"] [data-testid="queue-position"]')
        expect(position.first).to_have_text("1")
        page.goto(f"{site.base}/experiments/{experiment_id}")
        shown = page.locator('[data-testid="config"]')
        expect(shown).to_contain_text("global_batch_size: 32  # per step, over all slots")
        expect(shown).to_contain_text('api_token: "********"')
        expect(shown).not_to_contain_text("hunter2")
        screenshot(page, "config-as-submitted")
        page.context.close()
    finally:
        site.cluster.cli("experiment", "kill", str(experiment_id))
