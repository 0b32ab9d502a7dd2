"""The web UI in a real browser: headless Chromium (Debian's) driven by Playwright, against
a real `assay-master` and `assay-agent` running a real search on the digits example.

Screenshots of every page are saved under `artefacts/webui/` at the repository's root
(or `$ASSAY_ARTEFACTS/webui/`), for a person to look at after the run.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from assay.master.api import BUILD_COMMAND, DEFAULT_UI_DIR
from tests.credentials import ADMIN_PASSWORD
from tests.e2e.conftest import ROOT, Cluster, start_cluster, stop_cluster

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTEFACTS = Path(os.environ.get("ASSAY_ARTEFACTS", ROOT / "artefacts")) / "webui"

# Three trials of the digits CNN, two at a time, each validating every 20 batches.
SEARCH = """
name: digits-web
labels: [web, digits]
entrypoint: model_def:DigitsTrial
hyperparameters:
  global_batch_size: 32
  lr: {type: log, minval: -3, maxval: -2, base: 10}
  n_filters: 8
  dropout: 0.1
searcher:
  name: random
  metric: accuracy
  smaller_is_better: false
  max_length: {batches: 60}
  max_trials: 3
  max_concurrent_trials: 2
min_validation_period: {batches: 20}
min_checkpoint_period: {batches: 60}
scheduling_unit: 20
reproducibility: {experiment_seed: 3}
"""

# Long enough to be paused from the page while it runs.
LONG = SEARCH.replace("name: digits-web", "name: digits-long").replace(
    "max_length: {batches: 60}", "max_length: {batches: 100000}"
)


@dataclass
class Site:
    cluster: Cluster
    browser: Browser
    experiment_id: int
    trial_ids: list[int]
    tmp: Path
    # The browser's storage after logging in through the login page once.
    session: Any = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.cluster.http_port}"

    def page(self, logged_in: bool = True) -> Page:
        context = self.browser.new_context(
            viewport={"width": 1400, "height": 900},
            storage_state=self.session if logged_in else None,
        )
        page = context.new_page()
        page.set_default_timeout(20_000)
        return page

    def log_in(self, page: Page, password: str = ADMIN_PASSWORD) -> None:
        """Fill and send the login form the page shows."""
        page.locator('[data-testid="login-username"]').fill("admin")
        page.locator('[data-testid="login-password"]').fill(password)
        page.locator('[data-testid="login-submit"]').click()

    def keep_session(self) -> None:
        """Log in through the login page once; later pages start with its storage."""
        page = self.page(logged_in=False)
        page.goto(self.base + "/")
        page.wait_for_url("**/login**")
        self.log_in(page)
        page.locator('[data-testid="current-user"]').wait_for()
        self.session = page.context.storage_state()
        page.context.close()

    def submit(self, config: str, *extra: str) -> int:
        path = self.tmp / f"config-{time.monotonic_ns()}.yaml"
        path.write_text(config)
        model = str(ROOT / "examples" / "digits")
        created = self.cluster.json("experiment", "create", str(path), model, *extra)
        return int(created["id"])

    def describe(self, experiment_id: int) -> dict[str, Any]:
        described: dict[str, Any] = self.cluster.json("experiment", "describe", str(experiment_id))
        return described


def screenshot(page: Page, name: str) -> None:
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTEFACTS / f"{name}.png"), full_page=True)


def _wait_state(site: Site, experiment_id: int, states: set[str], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = str(site.describe(experiment_id)["state"])
        if state in states:
            return state
        time.sleep(1)
    raise AssertionError(
        f"experiment {experiment_id} is {state}, not {states}:\n{site.cluster.dump_logs()}"
    )


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists() or shutil.which("chromium") is None:
        pytest.fail(
            f"{CHROMIUM} is missing: install Debian's chromium package "
            "(apt-get install -y chromium), as the README's test command does"
        )
    if not (DEFAULT_UI_DIR / "index.html").is_file():
        pytest.fail(f"the web UI is not built ({DEFAULT_UI_DIR}): {BUILD_COMMAND}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="session")
def site(browser: Browser, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """One cluster and finished search for every module that uses it (test_browser.py,
    test_users_page.py): what a test adds (users, experiments it kills) leaves the finished
    search, the agent and the admin's session as they were."""
    tmp = tmp_path_factory.mktemp("webui")
    cluster = start_cluster(tmp, None, agents=1, slots=2)
    try:
        site = Site(cluster, browser, 0, [], tmp)
        site.keep_session()
        site.experiment_id = site.submit(SEARCH)
        _wait_state(site, site.experiment_id, {"COMPLETED"}, timeout=240)
        trials = site.describe(site.experiment_id)["trials"]
        site.trial_ids = [int(t["id"]) for t in trials]
        yield site
    finally:
        stop_cluster(cluster)


def wait_state(site: Site, experiment_id: int, states: set[str], timeout: float = 60) -> str:
    return _wait_state(site, experiment_id, states, timeout)
