"""Users and login sessions in the store, on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from assay.master.errors import ConflictError, NotFoundError
from assay.master.store import Store

T0 = dt.datetime(2030, 5, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)


def _session(store: Store, user_id: int, token_hash: str, expires: dt.datetime = T0 + HOUR) -> None:
    store.create_session(user_id, token_hash, expires, peer="10.0.0.7", created_at=T0)


def test_users_made_as_experiment_owners_have_no_password(store: Store) -> None:
    owner = store.ensure_user("owner")
    alice = store.create_user("alice", password_hash="scrypt$x", admin=True)

    assert not owner.has_password
    assert not owner.admin
    assert alice.has_password
    assert alice.admin
    assert store.ensure_user("alice") == alice
    assert [u.username for u in store.list_users()] == ["alice", "owner"]
    with pytest.raises(ConflictError, match="'alice' already exists"):
        store.create_user("alice")


def test_credentials_carry_the_hash_but_never_print_it(store: Store) -> None:
    store.create_user("alice", password_hash="scrypt$secret-hash")

    credentials = store.get_credentials("alice")

    assert credentials.password_hash == "scrypt$secret-hash"
    assert credentials.user.username == "alice"
    assert "secret-hash" not in repr(credentials)
    with pytest.raises(NotFoundError, match="'bob' does not exist"):
        store.get_credentials("bob")


def test_a_session_keeps_its_times_in_utc_with_its_users_state(store: Store) -> None:
    user = store.create_user("alice", password_hash="h")
    paris = dt.timezone(dt.timedelta(hours=2))

    made = store.create_session(user.id, "a" * 64, (T0 + HOUR).astimezone(paris), created_at=T0)
    found = store.get_session("a" * 64)

    assert found == made
    assert found.expires_at == T0 + HOUR
    assert found.expires_at.tzinfo is not None
    assert found.created_at == T0
    assert (found.username, found.admin, found.active) == ("alice", False, True)
    assert found.last_used_at is None
    store.touch_session("a" * 64, T0 + dt.timedelta(minutes=5))
    assert store.get_session("a" * 64).last_used_at == T0 + dt.timedelta(minutes=5)
    store.touch_session("gone", T0)  # a session ended meanwhile is ignored


def test_token_hashes_are_unique(store: Store) -> None:
    user = store.create_user("alice")
    _session(store, user.id, "a" * 64)
    with pytest.raises(IntegrityError):
        _session(store, user.id, "a" * 64)


def test_sessions_end_one_or_all_but_one(store: Store) -> None:
    alice = store.create_user("alice", password_hash="h")
    bob = store.create_user("bob", password_hash="h")
    for token_hash in ("a1", "a2", "a3"):
        _session(store, alice.id, token_hash)
    _session(store, bob.id, "b1")

    assert store.delete_session("a1")
    assert not store.delete_session("a1")  # idempotent
    with pytest.raises(NotFoundError):
        store.get_session("a1")
    store.set_password_hash("alice", "h2", keep_session="a3")  # ends the others
    assert [s.id for s in store.list_sessions(alice.id)] == [store.get_session("a3").id]
    store.set_user_active("alice", False)  # ends them all
    assert store.list_sessions(alice.id) == []
    assert store.get_session("b1").username == "bob"


def test_a_new_password_ends_the_users_other_sessions_at_once(store: Store) -> None:
    alice = store.create_user("alice", password_hash="old")
    _session(store, alice.id, "keep")
    _session(store, alice.id, "drop")

    updated = store.set_password_hash("alice", "new", keep_session="keep")

    assert updated.has_password
    assert store.get_credentials("alice").password_hash == "new"
    assert [s.id for s in store.list_sessions(alice.id)] == [store.get_session("keep").id]
    store.set_password_hash("alice", "newer")
    assert store.list_sessions(alice.id) == []
    with pytest.raises(NotFoundError):
        store.set_password_hash("nobody", "h")


def test_deactivation_ends_sessions_and_refuses_new_ones(store: Store) -> None:
    alice = store.create_user("alice", password_hash="h")
    _session(store, alice.id, "a1")

    assert not store.set_user_active("alice", False).active

    assert store.list_sessions(alice.id) == []
    with pytest.raises(ConflictError, match="deactivated"):
        _session(store, alice.id, "a2")
    assert store.set_user_active("alice", True).active
    _session(store, alice.id, "a2")
    with pytest.raises(NotFoundError):
        store.create_session(999, "x", T0)


def test_admin_rights_are_granted_and_withdrawn(store: Store) -> None:
    store.create_user("alice")
    assert store.set_user_admin("alice", True).admin
    assert store.get_user("alice").admin
    assert not store.set_user_admin("alice", False).admin
    with pytest.raises(NotFoundError):
        store.set_user_admin("nobody", True)


def test_expired_sessions_are_purged(store: Store) -> None:
    alice = store.create_user("alice", password_hash="h")
    _session(store, alice.id, "old", T0)
    _session(store, alice.id, "new", T0 + HOUR)

    assert store.purge_expired_sessions(T0) == 1
    assert store.purge_expired_sessions(T0) == 0
    assert store.get_session("new").expires_at == T0 + HOUR


def test_claim_admin_gives_the_owner_admin_a_password_once(store: Store) -> None:
    store.ensure_user("admin")  # the default experiment owner: no password, no rights

    assert store.claim_admin("admin", "first")
    assert not store.claim_admin("admin", "second")

    credentials = store.get_credentials("admin")
    assert credentials.password_hash == "first"
    assert credentials.user.admin
    assert credentials.user.active


def test_masters_starting_together_claim_admin_once(store: Store) -> None:
    results: list[bool] = []
    errors: list[BaseException] = []

    def claim(n: int) -> None:
        try:
            results.append(store.claim_admin("admin", f"hash-{n}"))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=claim, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    assert sorted(results) == [False, False, False, True]


def test_the_sessions_table_keeps_no_token(store: Store) -> None:
    alice = store.create_user("alice", password_hash="h")
    _session(store, alice.id, "0" * 64)
    with store.read() as s:
        columns = s.execute(text("SELECT * FROM sessions")).keys()
    assert set(columns) == {
        "id",
        "user_id",
        "token_hash",
        "peer",
        "created_at",
        "expires_at",
        "last_used_at",
    }
