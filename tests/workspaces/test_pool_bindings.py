"""Pool bindings in the store (SQLite and PostgreSQL) and in the settings: what is kept,
what a refusal says, and the queries the role checks and agent listings use."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from assay.common.settings import SettingsError
from assay.master._config import MasterConfig, load_master_config
from assay.master.errors import (
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
)
from assay.master.fleet import Binding, PoolAccess, ResourcePools, pool_workspaces
from assay.master.store import DEFAULT_WORKSPACE_ID, Store
from assay.proto import api_pb2
from tests.http.conftest import open_site
from tests.master.conftest import ScriptedAgent
from tests.store import _seed as seed
from tests.store.conftest import db_url, migrated, postgres_url  # noqa: F401 - fixtures


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:  # noqa: F811
    s = Store.open(migrated(db_url))
    yield s
    s.close()


def _config(tmp_path: Path, pools: list[dict[str, object]]) -> MasterConfig:
    return MasterConfig(
        state_dir=tmp_path, resource_pools=ResourcePools().parse(pools), default_resource_pool="a"
    )


def test_bindings_are_kept_shown_at_once_and_hold_their_workspace(store: Store) -> None:
    alice = store.user_id("alice")
    team = store.create_workspace("team", alice)
    other = store.create_workspace("other", alice)
    assert store.pool_bindings() == {}

    assert store.bind_pool("gpu", team.id) is True
    assert store.bind_pool("gpu", team.id) is False  # idempotent
    assert store.bind_pool("gpu", other.id) is True
    assert store.pool_bindings() == {"gpu": frozenset({team.id, other.id})}
    assert store.unbind_pool("gpu", other.id) is True
    assert store.unbind_pool("gpu", other.id) is False
    assert store.pool_bindings() == {"gpu": frozenset({team.id})}
    with pytest.raises(NotFoundError):
        store.bind_pool("gpu", 9999)

    # Deleted with it, the binding would leave the pool open to every workspace.
    with pytest.raises(ConflictError, match="unbinds it first"):
        store.delete_workspace(team.id)
    assert store.pool_bindings() == {"gpu": frozenset({team.id})}
    assert store.unbind_pool("gpu", team.id) is True
    store.delete_workspace(team.id)
    assert store.pool_bindings() == {}


def test_a_workspace_the_settings_name_is_made_without_members_once(store: Store) -> None:
    made = store.settings_workspace("vision")
    again = store.settings_workspace("vision")

    assert made == again
    assert store.list_members(made.id) == []
    assert store.settings_workspace("Default").id == DEFAULT_WORKSPACE_ID
    with pytest.raises(InvalidArgumentError, match="workspace name 'no/slash'"):
        store.settings_workspace("no/slash")


def test_experiment_workspaces_owners_and_visible_trials(store: Store) -> None:
    alice, bob = store.user_id("alice"), store.user_id("bob")
    team = store.create_workspace("team", alice)
    project = store.create_project(team.id, "p")
    mine = seed.experiment(store, owner="alice")
    theirs = seed.experiment(store, owner="bob")
    store.move_experiment(theirs, project.id)
    mine_trial, their_trial = seed.trial(store, mine), seed.trial(store, theirs)

    assert store.experiment_workspaces([mine, theirs, 999]) == {
        mine: DEFAULT_WORKSPACE_ID,
        theirs: team.id,
    }
    where = store.experiment_where(theirs)
    assert (where.workspace_id, where.project_id, where.owner_id) == (team.id, project.id, bob)
    both = {mine_trial, their_trial, 999}
    assert store.trials_in(both, {DEFAULT_WORKSPACE_ID}) == {mine_trial}
    assert store.trials_in(both, {team.id, DEFAULT_WORKSPACE_ID}) == {
        mine_trial,
        their_trial,
    }
    assert store.trials_in(both, set()) == set()


def test_the_settings_and_the_store_both_bind(store: Store, tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        [{"name": "a"}, {"name": "gpu", "workspaces": ["vision", "vision"]}, {"name": "b"}],
    )
    access = PoolAccess(store, config, ("a", "gpu", "b"))
    vision = store.get_workspace("vision")
    nlp = store.create_workspace("nlp", store.user_id("alice"))
    snapshot = store.directory.get()

    assert access.allowed("a", snapshot) is None  # unbound: open to all
    assert access.allowed("gpu", snapshot) == frozenset({vision.id})
    assert access.bind("gpu", nlp) is True
    assert access.bind("gpu", vision) is False  # the settings' own
    assert access.bindings("gpu") == [Binding("nlp", False), Binding("vision", True)]
    access.check({"resources": {"resource_pool": "gpu"}}, nlp.id, store.directory.get())
    with pytest.raises(PermissionDeniedError) as refused:
        access.check(
            {"resources": {"resource_pool": "gpu"}}, DEFAULT_WORKSPACE_ID, store.directory.get()
        )
    assert str(refused.value) == (
        "resources.resource_pool: pool 'gpu' is bound to workspaces 'nlp', 'vision'; "
        "experiments of workspace 'Default' may not use it (file the experiment in one of "
        "those workspaces, choose another pool, or ask an administrator: `assay "
        "resource-pool bind gpu Default`)"
    )
    access.check({}, DEFAULT_WORKSPACE_ID, snapshot)  # the default pool, "a": open

    with pytest.raises(ConflictError, match="by the master's settings"):
        access.unbind("gpu", vision)
    access.unbind("gpu", nlp)
    with pytest.raises(NotFoundError, match="pool 'gpu' is not bound to workspace 'nlp'"):
        access.unbind("gpu", nlp)
    with pytest.raises(NotFoundError, match="this master's pools are a, gpu, b"):
        access.bind("tpu", nlp)
    with pytest.raises(InvalidArgumentError, match="give a resource pool's name"):
        access.bindings("")
    assert access.named_by_settings(vision.id) == ["gpu"]
    assert access.named_by_settings(nlp.id) == []


@pytest.mark.parametrize(
    ("workspaces", "message"),
    [
        ("vision", "workspaces must be a list of workspace names"),
        ([1], "workspaces must be a list of workspace names"),
        (["a/b"], "workspaces: 'a/b' is not a workspace name"),
        (["trailing "], "workspaces: 'trailing ' is not a workspace name"),
    ],
)
def test_bad_settings_bindings_are_refused_with_what_to_fix(
    tmp_path: Path, workspaces: object, message: str
) -> None:
    file = tmp_path / "master.yaml"
    file.write_text(
        "resource_pools:\n  - name: default\n  - name: gpu\n    workspaces: "
        + repr(workspaces).replace("'", '"')
        + "\n"
    )
    with pytest.raises(SettingsError, match=message):
        load_master_config(file, {}, {})


def test_settings_bindings_parse_from_the_file(tmp_path: Path) -> None:
    file = tmp_path / "master.yaml"
    file.write_text(
        "resource_pools:\n  - {name: default}\n  - {name: gpu, workspaces: [vision, nlp]}\n"
    )
    config = load_master_config(file, {}, {})

    assert pool_workspaces(config.resource_pools) == {"gpu": ("vision", "nlp")}
    assert [s.name for s in config.pool_specs] == ["default", "gpu"]  # the scheduler's part


def test_a_restarted_master_still_holds_back_what_a_binding_keeps_out(tmp_path: Path) -> None:
    """The runtime binding is in the store: after a restart, the queued trial of an
    experiment of another workspace still waits, saying why, until it is unbound."""
    pools = ResourcePools().parse([{"name": "default"}, {"name": "shared"}])
    site = open_site(tmp_path / "master", resource_pools=pools)
    try:
        site.api.CreateWorkspace(api_pb2.CreateWorkspaceRequest(name="team"))
        eid = site.create(resources={"resource_pool": "shared"})  # Default; no agent yet
        bind = api_pb2.BindResourcePoolRequest(pool="shared", workspace="team")
        site.api.BindResourcePool(bind)
    finally:
        site.close()
    site = open_site(tmp_path / "master", resource_pools=pools)
    agent = ScriptedAgent(site.master.port, "shared-agent", slots=1, pool="shared")
    try:
        agent.nothing(1.0)
        [queued] = site.api.GetQueue(api_pb2.GetQueueRequest()).trials
        assert queued.experiment_id == eid
        assert "pool 'shared' is bound to workspace 'team'" in queued.reason
        site.api.UnbindResourcePool(
            api_pb2.UnbindResourcePoolRequest(pool="shared", workspace="team")
        )
        assert agent.next("start").start.trial_id == queued.trial_id
    finally:
        agent.close()
        site.close()
