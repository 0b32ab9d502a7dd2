"""The users and account pages in headless Chromium, against a real master.

An administrator creates a user through the form (the CLI sees her); she logs in, is told
that only administrators manage users and has no link to the page; she changes her
password on the account page (a wrong current one is refused without ending her session)
and logs in with the new one; the administrator deactivates her, which ends her sessions
and refuses her next login with the master's message; activated again, she logs in with
the password the administrator reset. The only admin is not offered "Deactivate" (and the
master refuses it) until there is a second one.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from playwright.sync_api import Page, expect

from tests.webui.conftest import Site, screenshot

pytestmark = pytest.mark.slow

WENDY = "wendy"
FIRST_PASSWORD = "wendy-first-pass"
NEW_PASSWORD = "wendy-second-pass"
RESET_PASSWORD = "wendy-third-pass"


def _log_in_as(site: Site, username: str, password: str, path: str = "/") -> Page:
    """A fresh browser context that visits `path` and sends the login form it gets."""
    page = site.page(logged_in=False)
    page.goto(site.base + path)
    page.wait_for_url("**/login**")
    page.locator('[data-testid="login-username"]').fill(username)
    page.locator('[data-testid="login-password"]').fill(password)
    page.locator('[data-testid="login-submit"]').click()
    return page


def _cli_users(site: Site) -> dict[str, dict[str, object]]:
    done = site.cluster.cli("user", "list", "--json")
    assert done.returncode == 0, done.stderr
    users: list[dict[str, object]] = json.loads(done.stdout)
    return {str(u["username"]): u for u in users}


def test_admin_manages_users_and_a_user_changes_her_password(site: Site) -> None:
    admin = site.page()
    admin.goto(site.base + "/users")
    expect(admin.locator('[data-testid="nav-users"]')).to_be_visible()
    admin_row = admin.locator('[data-testid="user-row"][data-username="admin"]')
    expect(admin_row.locator('[data-testid="user-admin"]')).to_be_visible()

    # Two passwords that differ never reach the master.
    form = admin.locator('[data-testid="user-new"]')
    form.locator('[data-testid="user-new-name"]').fill(WENDY)
    form.locator('[data-testid="user-new-password"]').fill(FIRST_PASSWORD)
    form.locator('[data-testid="user-new-password2"]').fill(FIRST_PASSWORD + "x")
    form.locator('[data-testid="user-new-submit"]').click()
    expect(form.locator('[data-testid="error"]')).to_contain_text("differ")
    form.locator('[data-testid="user-new-password2"]').fill(FIRST_PASSWORD)
    form.locator('[data-testid="user-new-submit"]').click()
    wendy_row = admin.locator(f'[data-testid="user-row"][data-username="{WENDY}"]')
    expect(wendy_row).to_be_visible()
    expect(wendy_row.locator('[data-testid="user-status"]')).to_have_text("active")
    expect(wendy_row.locator('[data-testid="user-admin"]')).to_have_count(0)
    expect(form.locator('[data-testid="error"]')).to_have_count(0)
    assert _cli_users(site)[WENDY] == {"username": WENDY, "admin": False, "active": True}

    # The master's refusal is shown as it said it.
    form.locator('[data-testid="user-new-name"]').fill(WENDY)
    form.locator('[data-testid="user-new-password"]').fill(FIRST_PASSWORD)
    form.locator('[data-testid="user-new-password2"]').fill(FIRST_PASSWORD)
    form.locator('[data-testid="user-new-submit"]').click()
    expect(form.locator('[data-testid="error"]')).to_contain_text("already exists")
    form.locator('[data-testid="user-new-name"]').fill("")
    form.locator('[data-testid="user-new-password"]').fill("")
    form.locator('[data-testid="user-new-password2"]').fill("")
    screenshot(admin, "users")

    # Wendy is no admin: no link, and the page says who may use it.
    wendy = _log_in_as(site, WENDY, FIRST_PASSWORD, "/users")
    wendy.wait_for_url(re.compile(r"/users$"))
    expect(wendy.locator('[data-testid="current-user"]')).to_have_text(WENDY)
    expect(wendy.locator('[data-testid="users-admins-only"]')).to_contain_text(
        "Only administrators manage users"
    )
    expect(wendy.locator('[data-testid="nav-users"]')).to_have_count(0)
    expect(wendy.locator('[data-testid="user-row"]')).to_have_count(0)

    # Her account page: a wrong current password is refused and she stays logged in.
    wendy.locator('[data-testid="account-link"]').click()
    wendy.wait_for_url(re.compile(r"/account$"))
    wendy.locator('[data-testid="account-old"]').fill("not-her-password")
    wendy.locator('[data-testid="account-new"]').fill(NEW_PASSWORD)
    wendy.locator('[data-testid="account-new2"]').fill(NEW_PASSWORD)
    wendy.locator('[data-testid="account-submit"]').click()
    expect(wendy.locator('[data-testid="error"]')).to_contain_text("current password is wrong")
    assert re.search(r"/account$", wendy.url)
    wendy.locator('[data-testid="account-old"]').fill(FIRST_PASSWORD)
    wendy.locator('[data-testid="account-new"]').fill(NEW_PASSWORD)
    wendy.locator('[data-testid="account-new2"]').fill(NEW_PASSWORD)
    wendy.locator('[data-testid="account-submit"]').click()
    expect(wendy.locator('[data-testid="account-message"]')).to_contain_text("changed")
    expect(wendy.locator('[data-testid="error"]')).to_have_count(0)
    screenshot(wendy, "account")
    # This session survives the change.
    wendy.reload()
    expect(wendy.locator('[data-testid="current-user"]')).to_have_text(WENDY)
    wendy.context.close()

    again = _log_in_as(site, WENDY, NEW_PASSWORD)
    expect(again.locator('[data-testid="current-user"]')).to_have_text(WENDY)

    # Deactivating asks first, then ends her sessions and refuses her logins.
    wendy_row.locator('[data-testid="user-deactivate"]').click()
    admin.locator('[data-testid="confirm-ok"]').click()
    expect(wendy_row.locator('[data-testid="user-status"]')).to_have_text("deactivated")
    expect(wendy_row.locator('[data-testid="user-activate"]')).to_be_visible()
    assert _cli_users(site)[WENDY]["active"] is False
    again.reload()
    again.wait_for_url("**/login**")
    again.context.close()

    refused = _log_in_as(site, WENDY, NEW_PASSWORD)
    expect(refused.locator('[data-testid="login-error"]')).to_contain_text(
        "wrong username or password"
    )
    refused.context.close()

    # Activated again, with a password the administrator set, she logs in once more.
    wendy_row.locator('[data-testid="user-activate"]').click()
    expect(wendy_row.locator('[data-testid="user-status"]')).to_have_text("active")
    wendy_row.locator('[data-testid="user-reset"]').click()
    dialog = admin.locator('[data-testid="user-reset-form"]')
    dialog.locator('[data-testid="user-reset-password"]').fill(RESET_PASSWORD)
    dialog.locator('[data-testid="user-reset-password2"]').fill(RESET_PASSWORD)
    dialog.locator('[data-testid="user-reset-submit"]').click()
    expect(dialog).to_have_count(0)
    expect(admin.locator('[data-testid="users-message"]')).to_contain_text("new password")
    back = _log_in_as(site, WENDY, RESET_PASSWORD)
    expect(back.locator('[data-testid="current-user"]')).to_have_text(WENDY)
    back.context.close()
    admin.context.close()


def test_the_only_admin_is_not_offered_deactivate(site: Site) -> None:
    admin = site.page()
    admin.goto(site.base + "/users")
    row = admin.locator('[data-testid="user-row"][data-username="admin"]')
    expect(row.locator('[data-testid="user-last-admin"]')).to_have_text("the only admin")
    expect(row.locator('[data-testid="user-deactivate"]')).to_have_count(0)
    # The master refuses it too, to whoever asks.
    status, message = admin.evaluate(
        """async () => {
            const r = await fetch('/api/v1/users/admin/deactivate', {
                method: 'POST', body: '{}',
                headers: {Authorization: 'Bearer ' + localStorage.getItem('assay.token'),
                          'Content-Type': 'application/json'}});
            return [r.status, await r.text()];
        }"""
    )
    assert status == 409, message
    assert "last active admin" in message
    assert _cli_users(site)["admin"]["active"] is True

    # With a second admin, either may be deactivated.
    cli = [sys.executable, "-m", "assay.cli.main", "-m", site.cluster.address]
    created = subprocess.run(
        [*cli, "user", "create", "ada", "--admin", "--password-stdin"],
        input="ada-admin-password\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert created.returncode == 0, created.stderr
    admin.reload()
    expect(row.locator('[data-testid="user-deactivate"]')).to_be_visible()
    ada = admin.locator('[data-testid="user-row"][data-username="ada"]')
    expect(ada.locator('[data-testid="user-deactivate"]')).to_be_visible()
    expect(admin.locator('[data-testid="user-last-admin"]')).to_have_count(0)
    admin.context.close()
