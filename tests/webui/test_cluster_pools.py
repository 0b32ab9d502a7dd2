"""The cluster page in headless Chromium, against a real master process whose pool "gpu"
is bound to workspace "vision" by its settings, and an agent of that pool (speaking the
real agent protocol) running a trial of "vision".

A user who is not in "vision" sees the slot busy, without the trial; the admin sees the
trial. The pools show their workspaces, and the admin binds a pool to a workspace and
removes the binding from the page (the settings' binding has no remove button).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from playwright.sync_api import Browser, Page, expect

from assay.proto import api_pb2
from tests.credentials import authed_api, login
from tests.e2e.conftest import start_cluster, stop_cluster
from tests.master.conftest import ScriptedAgent, experiment_yaml, model_archive
from tests.webui.conftest import Site, screenshot

pytestmark = pytest.mark.slow

POOLS = "[{name: default}, {name: gpu, workspaces: [vision]}]"
BOB = "bob-password-1"


@dataclass
class Cluster:
    site: Site
    trial_id: int


@pytest.fixture(scope="module")
def cluster(browser: Browser, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("webui-pools")
    running = start_cluster(
        tmp, None, agents=0, slots=0, master_env={"ASSAY_RESOURCE_POOLS": POOLS}
    )
    api, channel = authed_api(running.address, login(running.address))
    agent = None
    try:
        api.CreateUser(api_pb2.CreateUserRequest(username="bob", password=BOB))
        api.CreateProject(api_pb2.CreateProjectRequest(workspace="vision", name="p"))
        port = int(running.address.rsplit(":", 1)[1])
        agent = ScriptedAgent(port, "gpu-agent", slots=2, pool="gpu")
        config = experiment_yaml(
            workspace="vision", project="p", resources={"resource_pool": "gpu"}
        )
        api.CreateExperiment(
            api_pb2.CreateExperimentRequest(
                config_yaml=config, model_definition=model_archive(), activate=True
            )
        )
        start = agent.next("start").start
        site = Site(running, browser, 0, [start.trial_id], tmp)
        site.keep_session()
        yield Cluster(site, start.trial_id)
    finally:
        if agent is not None:
            agent.close()
        channel.close()
        stop_cluster(running)


def _as_bob(site: Site) -> Page:
    page = site.page(logged_in=False)
    page.goto(site.base + "/cluster")
    page.wait_for_url("**/login**")
    page.locator('[data-testid="login-username"]').fill("bob")
    page.locator('[data-testid="login-password"]').fill(BOB)
    page.locator('[data-testid="login-submit"]').click()
    page.locator('[data-testid="current-user"]').wait_for()
    page.goto(site.base + "/cluster")
    return page


def test_a_slot_of_another_workspace_is_busy_without_its_trial(cluster: Cluster) -> None:
    page = _as_bob(cluster.site)
    row = page.locator('[data-testid="agent-row"][data-id="gpu-agent"]')
    expect(row).to_contain_text("0: busy")
    expect(row.locator('a[href^="/trials/"]')).to_have_count(0)
    expect(page.locator('[data-testid="cluster-totals"]')).to_contain_text("1Busy")
    screenshot(page, "cluster-as-outsider")

    admin = cluster.site.page()
    admin.goto(cluster.site.base + "/cluster")
    shown = admin.locator('[data-testid="agent-row"][data-id="gpu-agent"]')
    expect(shown.locator(f'a[href="/trials/{cluster.trial_id}"]')).to_be_visible()


def test_the_admin_binds_and_unbinds_a_pool_on_the_page(cluster: Cluster) -> None:
    page = cluster.site.page()
    page.goto(cluster.site.base + "/cluster")
    gpu = page.locator('[data-testid="pool-row"][data-id="gpu"]')
    expect(gpu.locator('[data-testid="pool-binding"]')).to_have_text(["vision"])
    expect(gpu.locator('[data-testid="pool-unbind"]')).to_have_count(0)  # the settings'
    default = page.locator('[data-testid="pool-row"][data-id="default"]')
    expect(default.locator('[data-testid="pool-workspaces"]')).to_contain_text("all")

    default.locator('[data-testid="pool-bind-name"]').fill("vision")
    default.locator('[data-testid="pool-bind"]').click()
    expect(default.locator('[data-testid="pool-binding"]')).to_contain_text(["vision"])
    expect(default.locator('[data-testid="pool-unbind"]')).to_have_count(1)
    screenshot(page, "cluster-pools-bound")
    default.locator('[data-testid="pool-bind-name"]').fill("nowhere")
    default.locator('[data-testid="pool-bind"]').click()
    expect(page.locator('[data-testid="error"]')).to_contain_text("workspace 'nowhere'")
    default.locator('[data-testid="pool-unbind"]').click()
    expect(default.locator('[data-testid="pool-binding"]')).to_have_count(0)
    expect(default.locator('[data-testid="pool-workspaces"]')).to_contain_text("all")

    # A user who is no admin sees the bindings, with no way to change them.
    outsider = _as_bob(cluster.site)
    gpu = outsider.locator('[data-testid="pool-row"][data-id="gpu"]')
    expect(gpu.locator('[data-testid="pool-binding"]')).to_have_text(["vision"])
    expect(outsider.locator('[data-testid="pool-bind"]')).to_have_count(0)
