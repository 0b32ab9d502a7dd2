"""`assay workspace`, `assay project` and `assay experiment move` against a real master,
the CLI run as a subprocess: every verb, its refusals and what they leave in place."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli.conftest import (
    CONFIG,
    REGRESSION_DIR,
    assert_ok,
    assert_one_line_error,
    run_cli,
)
from tests.credentials import ADMIN_PASSWORD
from tests.http.conftest import Site, open_site

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    opened = open_site(tmp_path_factory.mktemp("ws-cli") / "master")
    opened.master.auth.create_user("bob", "bob-password-1")
    yield opened
    opened.close()


def _cli(site: Site, home: Path, *args: object, user: str = "admin") -> Any:
    password = ADMIN_PASSWORD if user == "admin" else f"{user}-password-1"
    env = {"HOME": str(home), "ASSAY_USER": user, "ASSAY_PASSWORD": password}
    return run_cli(*args, master=f"127.0.0.1:{site.master.port}", env=env)


def _json(site: Site, home: Path, *args: object, user: str = "admin") -> Any:
    done = _cli(site, home, *args, "--json", user=user)
    assert_ok(done)
    return json.loads(done.stdout)


def _config(tmp_path: Path, **keys: Any) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, **keys}))
    return path


def test_workspaces_projects_members_and_moves(site: Site, tmp_path: Path) -> None:
    assert_ok(_cli(site, tmp_path, "workspace", "create", "team"))
    assert_ok(_cli(site, tmp_path, "project", "create", "team", "p1", "--description", "first"))
    assert_ok(_cli(site, tmp_path, "workspace", "add-member", "team", "bob", "--role", "viewer"))
    members = _json(site, tmp_path, "workspace", "members", "team")
    assert members == [
        {"username": "admin", "role": "admin"},
        {"username": "bob", "role": "viewer"},
    ]
    config = _config(tmp_path, workspace="team", project="p1")
    # bob is a viewer: he may not submit to team.
    refused = _cli(
        site, tmp_path, "experiment", "create", config, REGRESSION_DIR, "--paused", user="bob"
    )
    assert_one_line_error(refused, "bob is a viewer of workspace 'team'", "editor")
    created = _json(site, tmp_path, "experiment", "create", config, REGRESSION_DIR, "--paused")
    eid = created["id"]
    listed = _json(site, tmp_path, "experiment", "list", "--workspace", "team", "--project", "p1")
    assert [e["id"] for e in listed] == [eid]
    described = _json(site, tmp_path, "project", "describe", "team", "p1")
    assert (described["description"], described["num_experiments"]) == ("first", 1)
    assert [e["id"] for e in described["experiments"]] == [eid]
    workspaces = _json(site, tmp_path, "workspace", "list", user="bob")
    assert {w["name"]: w["role"] for w in workspaces} == {"Default": "editor", "team": "viewer"}
    # A viewer reads but does not steer.
    assert_ok(_cli(site, tmp_path, "experiment", "describe", eid, user="bob"))
    refused = _cli(site, tmp_path, "experiment", "kill", eid, user="bob")
    assert_one_line_error(refused, "bob is a viewer of workspace 'team'")
    # A non-empty project or workspace is not deleted; the reason says what to do.
    refused = _cli(site, tmp_path, "project", "delete", "team", "p1")
    assert_one_line_error(refused, "holds 1 experiment", "assay experiment move")
    refused = _cli(site, tmp_path, "workspace", "delete", "team")
    assert_one_line_error(refused, "holds 1 experiment")
    # An archived project takes no experiments; unarchived it does again.
    assert_ok(_cli(site, tmp_path, "project", "archive", "team", "p1"))
    refused = _cli(site, tmp_path, "experiment", "create", config, REGRESSION_DIR, "--paused")
    assert_one_line_error(refused, "archived")
    assert_ok(_cli(site, tmp_path, "project", "unarchive", "team", "p1"))
    # Move it out by a unique project name, then the empty project and workspace go.
    moved = _cli(site, tmp_path, "experiment", "move", eid, "Uncategorized")
    assert_ok(moved)
    assert "to Default/Uncategorized" in moved.stdout
    assert_ok(_cli(site, tmp_path, "project", "delete", "team", "p1"))
    assert_ok(_cli(site, tmp_path, "workspace", "remove-member", "team", "bob"))
    assert_ok(_cli(site, tmp_path, "workspace", "delete", "team"))
    assert [w["name"] for w in _json(site, tmp_path, "workspace", "list")] == ["Default"]
    assert site.master.store.get_experiment(eid).project == "Uncategorized"


def test_unknown_names_and_roles_are_one_clear_error(site: Site, tmp_path: Path) -> None:
    config = _config(tmp_path, project="nope")
    refused = _cli(site, tmp_path, "experiment", "create", config, REGRESSION_DIR, "--paused")
    assert_one_line_error(refused, "no project 'nope'", "its projects are Uncategorized")
    config = _config(tmp_path, workspace="elsewhere")
    refused = _cli(site, tmp_path, "experiment", "create", config, REGRESSION_DIR, "--paused")
    assert_one_line_error(refused, "no workspace 'elsewhere'", "Default")
    refused = _cli(site, tmp_path, "workspace", "describe", "elsewhere")
    assert_one_line_error(refused, "workspace 'elsewhere' does not exist")
    bad_role = _cli(site, tmp_path, "workspace", "add-member", "Default", "bob", "--role", "owner")
    assert_one_line_error(bad_role, "'owner' is not one of 'viewer', 'editor', 'admin'")
    refused = _cli(site, tmp_path, "experiment", "move", 99999, "Default/Uncategorized")
    assert_one_line_error(refused, "experiment 99999 does not exist")
    refused = _cli(site, tmp_path, "workspace", "create", "bad/name")
    assert_one_line_error(refused, "workspace name 'bad/name'")
    # Determined's default workspace name files into Default.
    config = _config(tmp_path, workspace="Uncategorized", project="Uncategorized")
    created = _json(site, tmp_path, "experiment", "create", config, REGRESSION_DIR, "--paused")
    assert site.master.store.get_experiment(created["id"]).workspace == "Default"


def test_resource_pool_bind_list_workspaces_and_unbind(site: Site, tmp_path: Path) -> None:
    """An admin binds the default pool to a workspace: submissions from Default are refused,
    naming the pool and its workspace, until the binding is removed."""
    assert_ok(_cli(site, tmp_path, "workspace", "create", "vis"))
    refused = _cli(site, tmp_path, "resource-pool", "bind", "default", "vis", user="bob")
    assert_one_line_error(refused, "only an administrator may bind resource pools")
    bound = _cli(site, tmp_path, "resource-pool", "bind", "default", "vis")
    assert_ok(bound)
    try:
        assert bound.stdout.strip() == "pool default takes experiments of workspace vis"
        listed = _json(site, tmp_path, "resource-pool", "list-workspaces", "default", user="bob")
        assert listed == [{"workspace": "vis", "from_settings": False}]
        [pool] = _json(site, tmp_path, "resource-pool", "list")
        assert pool["workspaces"] == listed
        config = _config(tmp_path)
        refused = _cli(site, tmp_path, "experiment", "create", config, REGRESSION_DIR, "--paused")
        assert_one_line_error(
            refused, "pool 'default' is bound to workspace 'vis'", "workspace 'Default'"
        )
    finally:
        unbound = _cli(site, tmp_path, "resource-pool", "unbind", "default", "vis")
    assert_ok(unbound)
    assert unbound.stdout.strip() == "pool default is open to every workspace"
    again = _cli(site, tmp_path, "resource-pool", "unbind", "default", "vis")
    assert_one_line_error(again, "pool 'default' is not bound to workspace 'vis'")
    unknown = _cli(site, tmp_path, "resource-pool", "bind", "tpu", "vis")
    assert_one_line_error(unknown, "resource pool 'tpu' does not exist", "default")
    assert_ok(_cli(site, tmp_path, "workspace", "delete", "vis"))
