"""Migration 0009 on a database of the release before it (revision 0007, with users and
experiments), on SQLite and PostgreSQL: nothing lost, everything in Default."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from sqlalchemy import text

from assay.master.errors import ConflictError, InvalidArgumentError
from assay.master.store import Store, current_revision, head_revision, migrate
from assay.master.store._engine import make_engine
from assay.master.store._migrate import MIGRATIONS
from tests.store import _seed as seed
from tests.store.conftest import db_url, postgres_url  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow


def _at_0007(tmp_path: Path, url: str) -> Store:
    location = tmp_path / "migrations-0007"
    shutil.copytree(MIGRATIONS, location)
    for later in (location / "versions").glob("*_*.py"):
        if later.name[:4] > "0007":
            later.unlink()
    engine = make_engine(url)
    assert migrate(engine, location) == "0007"
    engine.dispose()
    return Store.open(url, migrate_schema=False)


def test_existing_experiments_and_users_move_into_default(tmp_path: Path, db_url: str) -> None:  # noqa: F811
    old = _at_0007(tmp_path, db_url)
    ids = [
        seed.experiment(old, name=f"e{i}", owner=owner, labels=["kept"])
        for i, owner in enumerate(["alice", "bob", "alice"])
    ]
    old.create_user("carol", password_hash="x", admin=True)
    old.close()

    store = Store.open(db_url)  # migrates to head
    assert current_revision(store.engine) == head_revision()
    page = store.list_experiments(limit=100)
    assert sorted(e.id for e in page.items) == sorted(ids)
    for e in page.items:
        assert (e.workspace, e.project, e.labels) == ("Default", "Uncategorized", ("kept",))
    assert {e.owner for e in page.items} == {"alice", "bob"}
    [default] = store.list_workspaces()
    assert (default.name, default.num_projects, default.num_experiments) == ("Default", 1, 3)
    members = {m.username: m.role for m in store.list_members(default.id)}
    assert members == {"alice": "editor", "bob": "editor", "carol": "editor"}
    # A user made after the migration is an editor of Default too; a new workspace and
    # project get ids after the defaults' (no clash with the sequence on PostgreSQL).
    dave = store.create_user("dave")
    assert store.roles_of(dave.id) == {default.id: "editor"}
    team = store.create_workspace("team", dave.id)
    project = store.create_project(team.id, "p1")
    assert team.id > default.id
    assert project.id > 1
    assert store.roles_of(dave.id) == {default.id: "editor", team.id: "admin"}
    store.move_experiment(ids[0], project.id)
    moved = store.get_experiment(ids[0])
    assert (moved.workspace, moved.project) == ("team", "p1")
    # Refusals leave everything in place.
    with pytest.raises(ConflictError, match="holds 1 experiment"):
        store.delete_workspace(team.id)
    with pytest.raises(ConflictError, match="default workspace"):
        store.delete_workspace(default.id)
    with pytest.raises(ConflictError, match="already exists"):
        store.create_workspace("team", dave.id)
    with pytest.raises(InvalidArgumentError, match="workspace name"):
        store.create_workspace("a/b", dave.id)
    assert store.get_experiment(ids[0]).project == "p1"
    with store.read() as s:
        assert s.execute(text("SELECT count(*) FROM experiments")).scalar() == 3
    store.close()
