"""Migration 0009 on a database of the release before it (revision 0007, with users and
experiments), on SQLite and PostgreSQL: nothing lost, everything in Default."""

from __future__ import annotations

import shutil
import sqlite3
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


# --- the checked-in databases of the release before workspaces ------------------------------

RELEASES = Path(__file__).resolve().parents[1] / "fixtures" / "release_db"
# Where Store.open writes on opening (the version that last opened it), not data.
_BOOKKEEPING = {"alembic_version", "schema_info"}


def _tables(path: Path) -> dict[str, tuple[list[str], list[tuple[object, ...]]]]:
    """Every table's columns and rows (sorted), read with plain SQLite."""
    c = sqlite3.connect(path)
    try:
        names = [r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        out = {}
        for name in names:
            columns = [r[1] for r in c.execute(f'PRAGMA table_info("{name}")')]
            out[name] = (columns, _rows(c, name, columns))
        return out
    finally:
        c.close()


def _rows(c: sqlite3.Connection, table: str, columns: list[str]) -> list[tuple[object, ...]]:
    quoted = ", ".join(f'"{col}"' for col in columns)
    return sorted(c.execute(f'SELECT {quoted} FROM "{table}"').fetchall(), key=repr)


@pytest.mark.parametrize("revision", ["0007", "0008"])
def test_a_database_of_the_release_upgrades_to_head_with_nothing_lost(
    tmp_path: Path, revision: str
) -> None:
    # Written by tests/fixtures/release_db/make_release_db.py at the release's schema.
    copy = tmp_path / f"schema-{revision}.sqlite"
    shutil.copyfile(RELEASES / copy.name, copy)
    before = _tables(copy)
    assert before["alembic_version"][1] == [(revision,)]
    assert {t for t, (_, rows) in before.items() if not rows} == set()  # every table has rows

    store = Store.open(f"sqlite:///{copy}")  # migrates to head
    assert current_revision(store.engine) == head_revision()
    # Every experiment is in Default/Uncategorized, every user an editor of Default.
    experiments = [store.get_experiment(i) for i in (1, 2, 3)]
    assert [(e.name, e.owner, e.labels, e.archived) for e in experiments] == [
        ("digits-old", "alice", ("digits", "old"), False),
        ("paused-old", "bob", ("old",), False),
        ("archived-old", "admin", (), True),
    ]
    assert {(e.workspace, e.project) for e in experiments} == {("Default", "Uncategorized")}
    [default] = store.list_workspaces()
    assert (default.name, default.num_projects, default.num_experiments) == ("Default", 1, 3)
    members = {m.username: m.role for m in store.list_members(default.id)}
    assert members == dict.fromkeys(["admin", "alice", "bob", "carol"], "editor")
    # The data under them reads as before: trials, curves, checkpoints, logs, models.
    trials = store.list_trials(1)
    assert [(t.id, t.run_id, t.restarts, t.parent_trial_id) for t in trials] == [
        (1, 1, 0, None),
        (2, 2, 1, None),
    ]
    assert trials[1].last_error == "ChildFailed: exit code 1"
    curve = store.trial_curve(2, "loss", group="training")
    assert len(curve) == 40
    assert curve[0] == (1, 1.0)
    assert [b for b, _ in store.trial_curve(1, "accuracy")] == [20, 40]
    assert store.get_checkpoint("c-0007-1").files == {"state_dict.pt": 4096, "metadata.json": 120}
    assert [line.message for line in store.tail_logs(3)] == ["hello from trial 3"]
    if revision >= "0008":
        versions = store.list_versions("digits")
        assert [(v.version, v.checkpoint_uuid, v.experiment_id) for v in versions] == [
            (1, "c-0007-2", 1),
            (2, "c-0007-1", 1),
        ]
    store.close()

    # Nothing lost: every row of every table, in every column it had, is still there.
    after = _tables(copy)
    for table, (columns, rows) in before.items():
        if table in _BOOKKEEPING:
            continue
        c = sqlite3.connect(copy)
        try:
            assert _rows(c, table, columns) == rows, table
        finally:
            c.close()
        assert set(columns) <= set(after[table][0]), table
