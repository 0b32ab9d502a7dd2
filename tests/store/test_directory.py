"""The directory (store/_directory.py): the in-memory copy of workspaces, projects and
membership that every submission and role check reads. Each change made through the
store shows in the next read, with no wait; a change made by another process on the same
database shows once `ttl_s` has passed."""

from __future__ import annotations

import threading

import pytest

from assay.master.auth import Principal, Roles
from assay.master.errors import (
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
)
from assay.master.store import DEFAULT_WORKSPACE_ID, Store
from assay.master.store._directory import Directory, Snapshot


def _warm(store: Store) -> None:
    """Load the copy, so that a test sees whether a change drops it."""
    store.project_by_names("Default", "Uncategorized")
    assert store.directory.fresh()


def test_a_new_workspace_and_project_are_found_at_once(store: Store) -> None:
    admin = store.user_id("alice")
    _warm(store)
    assert store.project_by_names("team", "p1") is None
    workspace = store.create_workspace("team", admin)
    assert store.project_by_names("team", "p1") is None
    project = store.create_project(workspace.id, "p1", "first")
    found = store.project_by_names("team", "p1")
    assert found is not None
    assert found[0].id == workspace.id
    assert found[1].id == project.id
    assert found[1].description == "first"
    assert found[1].workspace == "team"
    assert store.role_in(admin, workspace.id) == "admin"  # the creator's membership too


def test_archiving_shows_at_once(store: Store) -> None:
    workspace = store.create_workspace("team", store.user_id("alice"))
    project = store.create_project(workspace.id, "p1")
    _warm(store)
    store.set_project_archived(project.id, True)
    found = store.project_by_names("team", "p1")
    assert found is not None
    assert found[1].archived
    assert not found[0].archived
    store.set_workspace_archived(workspace.id, True)
    found = store.project_by_names("team", "p1")
    assert found is not None
    assert found[0].archived
    store.set_workspace_archived(workspace.id, False)
    store.set_project_archived(project.id, False)
    found = store.project_by_names("team", "p1")
    assert found is not None
    assert not found[0].archived
    assert not found[1].archived


def test_deleting_a_project_or_workspace_shows_at_once(store: Store) -> None:
    workspace = store.create_workspace("team", store.user_id("alice"))
    p1 = store.create_project(workspace.id, "p1")
    store.create_project(workspace.id, "p2")
    _warm(store)
    store.delete_project(p1.id)
    assert store.project_by_names("team", "p1") is None
    assert store.project_by_names("team", "p2") is not None
    store.delete_workspace(workspace.id)
    assert store.project_by_names("team", "p2") is None
    assert store.roles_of(store.user_id("alice")).get(workspace.id) is None


def test_membership_changes_show_at_once(store: Store) -> None:
    workspace = store.create_workspace("team", store.user_id("alice"))
    bob = store.user_id("bob")
    _warm(store)
    assert store.role_in(bob, workspace.id) is None
    store.set_member(workspace.id, bob, "viewer")
    assert store.role_in(bob, workspace.id) == "viewer"
    assert store.roles_of(bob) == {DEFAULT_WORKSPACE_ID: "editor", workspace.id: "viewer"}
    store.set_member(workspace.id, bob, "editor")
    assert store.role_in(bob, workspace.id) == "editor"
    assert store.remove_member(workspace.id, bob)
    assert store.role_in(bob, workspace.id) is None
    assert workspace.id not in store.roles_of(bob)


def test_a_new_user_is_an_editor_of_the_default_workspace_at_once(store: Store) -> None:
    _warm(store)
    carol = store.create_user("carol")
    assert store.role_in(carol.id, DEFAULT_WORKSPACE_ID) == "editor"


def test_visible_limits_the_lookup(store: Store) -> None:
    workspace = store.create_workspace("team", store.user_id("alice"))
    store.create_project(workspace.id, "p1")
    assert store.project_by_names("team", "p1", visible={DEFAULT_WORKSPACE_ID}) is None
    assert store.project_by_names("team", "p1", visible={workspace.id}) is not None
    assert store.project_by_names("Default", "Uncategorized", visible=set()) is None


def test_a_refused_write_leaves_the_directory_right(store: Store) -> None:
    workspace = store.create_workspace("team", store.user_id("alice"))
    _warm(store)
    with pytest.raises(ConflictError):  # the name is taken
        store.create_workspace("team", store.user_id("alice"))
    found = store.project_by_names("Default", "Uncategorized")
    assert found is not None
    assert store.role_in(store.user_id("alice"), workspace.id) == "admin"


def test_another_process_change_shows_after_the_ttl(store: Store, db_url: str) -> None:
    now = [0.0]
    store.directory = Directory(store._load_directory, ttl_s=5.0, clock=lambda: now[0])
    _warm(store)
    other = Store.open(db_url, migrate_schema=False)  # as another master would
    try:
        workspace = other.create_workspace("team", other.user_id("alice"))
        other.create_project(workspace.id, "p1")
    finally:
        other.close()
    now[0] = 4.9
    assert store.project_by_names("team", "p1") is None  # the copy, within its time
    now[0] = 5.0
    assert store.project_by_names("team", "p1") is not None


def test_a_change_during_a_load_is_not_kept() -> None:
    """A write that commits while a reader loads: the reader's copy may predate it, so
    it is not kept and the next read loads again."""
    loads = []
    directory: Directory

    def load() -> Snapshot:
        loads.append(1)
        if len(loads) == 1:
            directory.changed()  # a write committed meanwhile
        return Snapshot()

    directory = Directory(load)
    directory.get()
    assert not directory.fresh()
    directory.get()
    assert directory.fresh()
    assert len(loads) == 2
    directory.get()
    assert len(loads) == 2


def test_readers_on_many_threads_see_a_change(store: Store) -> None:
    workspace = store.create_workspace("team", store.user_id("alice"))
    bob = store.user_id("bob")
    _warm(store)
    store.set_member(workspace.id, bob, "viewer")
    seen: list[str | None] = []
    threads = [
        threading.Thread(target=lambda: seen.append(store.role_in(bob, workspace.id)))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == ["viewer"] * 8


def test_roles_answer_a_submission_from_memory_only_when_fresh(store: Store) -> None:
    now = [0.0]
    store.directory = Directory(store._load_directory, ttl_s=5.0, clock=lambda: now[0])
    alice = store.user_id("alice")
    workspace = store.create_workspace("team", alice)
    project = store.create_project(workspace.id, "p1")
    bob = store.user_id("bob")
    roles = Roles(store)
    alice_p, bob_p = Principal(alice, "alice", False), Principal(bob, "bob", False)
    # Stale (just changed): only the store can tell.
    assert roles.new_experiment_project_now(alice_p, "team", "p1") is None
    found = roles.new_experiment_project(alice_p, "team", "p1")
    assert found.id == project.id
    assert roles.new_experiment_project_now(alice_p, "team", "p1") == found
    # Unknown names: the error lists the choices, which reads the store.
    assert roles.new_experiment_project_now(alice_p, "team", "nope") is None
    with pytest.raises(InvalidArgumentError):
        roles.new_experiment_project(alice_p, "team", "nope")
    # Not a member: as if the workspace did not exist.
    _warm(store)
    assert roles.new_experiment_project_now(bob_p, "team", "p1") is None
    store.set_member(workspace.id, bob, "viewer")
    _warm(store)
    with pytest.raises(PermissionDeniedError):
        roles.new_experiment_project_now(bob_p, "team", "p1")
    store.set_member(workspace.id, bob, "editor")
    _warm(store)
    assert roles.new_experiment_project_now(bob_p, "team", "p1") == found
    store.remove_member(workspace.id, bob)
    with pytest.raises((InvalidArgumentError, NotFoundError)):
        roles.new_experiment_project(bob_p, "team", "p1")
    # An archived project is refused from memory as from the store.
    store.set_project_archived(project.id, True)
    _warm(store)
    with pytest.raises(InvalidArgumentError, match="archived"):
        roles.new_experiment_project_now(alice_p, "team", "p1")
    now[0] = 6.0  # past the ttl: stale again
    assert roles.new_experiment_project_now(alice_p, "team", "p1") is None


def test_a_submission_reads_one_snapshot_even_if_it_goes_stale_meanwhile(store: Store) -> None:
    """Each call resolves the project from one copy: a copy that ages past `ttl_s` during
    the call is not loaded again (the event loop's answer does no I/O; the other loads
    once)."""
    alice = store.user_id("alice")
    workspace = store.create_workspace("team", alice)
    project = store.create_project(workspace.id, "p1")
    loads = []

    def load() -> Snapshot:
        loads.append(1)
        return store._load_directory()

    ticks = iter([0.0])  # the first reading of the clock, then past the ttl for good

    def clock() -> float:
        return next(ticks, 100.0)

    roles = Roles(store)
    alice_p = Principal(alice, "alice", False)
    store.directory = Directory(load, ttl_s=5.0, clock=clock)
    assert roles.new_experiment_project(alice_p, "team", "p1").id == project.id
    assert len(loads) == 1
    ticks = iter([0.0])
    assert store.directory.cached() is not None  # loaded at 0.0, read at 0.0
    ticks = iter([0.0])
    found = roles.new_experiment_project_now(alice_p, "team", "p1")
    assert found is not None
    assert found.id == project.id
    assert len(loads) == 1  # no I/O: answered from the copy it took
    assert roles.new_experiment_project_now(alice_p, "team", "p1") is None  # stale now
    assert len(loads) == 1


def test_snapshot_project_by_names_is_the_store_lookup(store: Store) -> None:
    workspace = store.create_workspace("team", store.user_id("alice"))
    store.create_project(workspace.id, "p1")
    snapshot = store.directory.get()
    for names, visible in [
        (("team", "p1"), None),
        (("team", "p1"), {DEFAULT_WORKSPACE_ID}),
        (("team", "p2"), None),
        (("nope", "p1"), None),
        (("Default", "Uncategorized"), set()),
    ]:
        assert snapshot.project_by_names(*names, visible) == store.project_by_names(*names, visible)
