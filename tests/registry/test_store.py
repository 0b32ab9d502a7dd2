"""The registry in the store: models, versions, their numbers, pins and bad input."""

from __future__ import annotations

import threading
import uuid as uuidlib

import pytest
from sqlalchemy import inspect as sa_inspect
from sqlalchemy import text

from assay.master.errors import (
    CheckpointInUseError,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
)
from assay.master.store import CheckpointRecord, Store, head_revision, migrate
from assay.master.store._batch import WriteBatch
from tests.store import _seed as seed
from tests.store.test_migrations import _downgrade


def _checkpoint(store: Store, trial_id: int, run_id: int, batches: int = 10) -> str:
    uuid = str(uuidlib.uuid4())
    store.add_checkpoint(
        CheckpointRecord(
            uuid=uuid,
            trial_id=trial_id,
            run_id=run_id,
            total_batches=batches,
            state="COMPLETED",
            location=f"/ckpt/{uuid}",
            files={"model.pt": 10},
        )
    )
    return uuid


def test_a_model_is_created_listed_patched_and_archived(store: Store) -> None:
    alice = store.user_id("alice")
    made = store.create_model(
        "resnet", owner_id=alice, description="d", labels=["a", " b", "a"], metadata={"k": 1}
    )
    assert (made.name, made.owner, made.labels, made.metadata) == (
        "resnet",
        "alice",
        ("a", "b"),
        {"k": 1},
    )
    assert (made.num_versions, made.latest_version, made.archived) == (0, 0, False)
    store.create_model("bert", owner_id=alice, labels=["nlp"])

    assert [m.name for m in store.list_models()] == ["bert", "resnet"]
    assert [m.name for m in store.list_models(name="RES")] == ["resnet"]
    assert store.list_models(name="%") == []  # a part of the name, not a pattern
    assert [m.name for m in store.list_models(label="nlp")] == ["bert"]

    patched = store.patch_model("resnet", metadata={"k": None, "j": "x"}, labels=["c"])
    assert (patched.metadata, patched.labels, patched.description) == ({"j": "x"}, ("c",), "d")
    store.patch_model("resnet", archived=True)
    assert [m.name for m in store.list_models(archived=False)] == ["bert"]
    assert [m.name for m in store.list_models(archived=True)] == ["resnet"]


def test_versions_count_up_and_numbers_are_not_reused(store: Store) -> None:
    _, trial_id, run_id = seed.trial_with_run(store)
    first, second = (
        _checkpoint(store, trial_id, run_id, 10),
        _checkpoint(store, trial_id, run_id, 20),
    )
    bob = store.user_id("bob")
    store.create_model("m", owner_id=store.user_id("alice"))

    v1 = store.register_version("m", first, user_id=bob, notes="n", labels=["prod"])
    v2 = store.register_version("m", second, user_id=bob, metadata={"acc": 0.9})
    assert (v1.version, v1.user, v1.notes, v1.labels, v1.checkpoint_uuid) == (
        1,
        "bob",
        "n",
        ("prod",),
        first,
    )
    assert (v2.version, v2.metadata) == (2, {"acc": 0.9})
    assert store.get_version("m", 0).version == 2  # 0: the latest
    assert store.get_model("m").num_versions == 2

    assert store.checkpoint_references([first, second, "x"]) == {
        first: [("m", 1)],
        second: [("m", 2)],
    }
    store.delete_version("m", 2)
    assert store.register_version("m", second, user_id=bob).version == 3
    assert [v.version for v in store.list_versions("m")] == [1, 3]
    assert store.patch_version("m", 3, notes="better").notes == "better"


def test_bad_input_is_refused_and_nothing_changes(store: Store) -> None:
    _, trial_id, run_id = seed.trial_with_run(store)
    ckpt = _checkpoint(store, trial_id, run_id)
    alice = store.user_id("alice")
    store.create_model("m", owner_id=alice, labels=["keep"])

    with pytest.raises(ConflictError, match="a model named 'm' exists already"):
        store.create_model("m", owner_id=alice)
    for name in ("", "a/b", "-x", "x" * 129, "a b"):
        with pytest.raises(InvalidArgumentError, match="model name .* is not allowed"):
            store.create_model(name, owner_id=alice)
    with pytest.raises(InvalidArgumentError, match="label"):
        store.patch_model("m", labels=["ok", ""])
    with pytest.raises(InvalidArgumentError, match="KiB"):
        store.patch_model("m", metadata={"big": "x" * 70_000})
    with pytest.raises(NotFoundError, match="model 'nope' does not exist"):
        store.register_version("nope", ckpt, user_id=alice)
    with pytest.raises(NotFoundError, match="checkpoint 0000 does not exist"):
        store.register_version("m", "0000", user_id=alice)
    with pytest.raises(NotFoundError, match="has no version 7"):
        store.get_version("m", 7)
    with pytest.raises(InvalidArgumentError, match="give a version number"):
        store.delete_version("m", 0)
    assert store.get_model("m").labels == ("keep",)
    assert store.list_versions("m") == []

    store.set_checkpoint_state(ckpt, "DELETED")
    with pytest.raises(ConflictError, match="was deleted"):
        store.register_version("m", ckpt, user_id=alice)
    store.set_checkpoint_state(ckpt, "COMPLETED")
    store.patch_model("m", archived=True)
    with pytest.raises(ConflictError, match="archived"):
        store.register_version("m", ckpt, user_id=alice)


def test_a_model_with_versions_is_deleted_only_with_force(store: Store) -> None:
    _, trial_id, run_id = seed.trial_with_run(store)
    ckpt = _checkpoint(store, trial_id, run_id)
    store.create_model("m", owner_id=store.user_id("alice"))
    store.register_version("m", ckpt, user_id=store.user_id("alice"))

    with pytest.raises(ConflictError, match="has 1 version: delete them first"):
        store.delete_model("m")
    assert store.get_model("m").num_versions == 1
    assert store.delete_model("m", force=True) == 1
    with pytest.raises(NotFoundError):
        store.get_model("m")
    assert store.checkpoint_references([ckpt]) == {}


def _ended(store: Store, experiment_id: int) -> None:
    batch = WriteBatch()
    batch.set_experiment(experiment_id, state="COMPLETED")
    seed.commit(store, batch)


def test_only_a_version_of_the_checkpoints_own_workspace_keeps_its_rows(store: Store) -> None:
    experiment_id, trial_id, run_id = seed.trial_with_run(store)  # in Default
    ckpt = _checkpoint(store, trial_id, run_id)
    alice, bob = store.user_id("alice"), store.user_id("bob")
    elsewhere = store.create_workspace("elsewhere", bob).id
    store.create_model("here", owner_id=alice)
    store.create_model("there", owner_id=bob, workspace_id=elsewhere)
    store.register_version("here", ckpt, user_id=alice)
    store.register_version("there", ckpt, user_id=bob)
    _ended(store, experiment_id)

    assert store.checkpoint_references([ckpt]) == {ckpt: [("here", 1), ("there", 1)]}
    assert store.checkpoint_pins([ckpt]) == {ckpt: [("here", 1)]}
    with pytest.raises(CheckpointInUseError, match="model 'here' version 1; delete"):
        store.delete_experiment(experiment_id)
    assert store.get_checkpoint(ckpt).uuid == ckpt
    assert store.get_version("there", 1).checkpoint_deleted_at is None

    store.delete_version("here", 1)
    store.delete_experiment(experiment_id)
    gone = store.get_version("there", 1)
    assert (gone.checkpoint_uuid, gone.experiment_id, gone.code_owner) == (ckpt, None, None)
    assert gone.checkpoint_deleted_at is not None
    assert store.checkpoint_references([ckpt]) == {}


def test_a_deleted_checkpoint_marks_the_versions_naming_it(store: Store) -> None:
    _, trial_id, run_id = seed.trial_with_run(store)
    ckpt = _checkpoint(store, trial_id, run_id)
    store.create_model("m", owner_id=store.user_id("bob"))
    made = store.register_version("m", ckpt, user_id=store.user_id("bob"))
    assert (made.code_owner, made.checkpoint_deleted_at) == ("alice", None)

    store.set_checkpoint_state(ckpt, "DELETED")
    marked = store.get_version("m", 1)
    assert marked.checkpoint_deleted_at is not None
    assert marked.code_owner is None
    store.set_checkpoint_state(ckpt, "DELETED")  # again: the first time is kept
    assert store.get_version("m", 1).checkpoint_deleted_at == marked.checkpoint_deleted_at


def test_concurrent_registrations_get_distinct_numbers(store: Store) -> None:
    _, trial_id, run_id = seed.trial_with_run(store)
    ckpt = _checkpoint(store, trial_id, run_id)
    user = store.user_id("alice")
    store.create_model("m", owner_id=user)
    numbers: list[int] = []
    errors: list[BaseException] = []

    def register() -> None:
        try:
            numbers.append(store.register_version("m", ckpt, user_id=user).version)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=register) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    assert sorted(numbers) == list(range(1, 9))
    assert store.get_model("m").latest_version == 8


def test_a_workspace_that_holds_a_model_is_not_deleted(store: Store) -> None:
    bob = store.user_id("bob")
    team = store.create_workspace("team", bob)
    made = store.create_model("m", owner_id=bob, workspace_id=team.id)
    assert (made.workspace_id, made.workspace) == (team.id, "team")

    with pytest.raises(ConflictError, match=r"'team' holds 1 model\(s\) of the registry: delete"):
        store.delete_workspace(team.id)
    assert store.get_workspace("team").id == team.id
    store.delete_model("m")
    store.delete_workspace(team.id)


def test_0013_downgrades_and_upgrades_with_the_models_and_versions(store: Store) -> None:
    _, trial_id, run_id = seed.trial_with_run(store)
    kept, lost = _checkpoint(store, trial_id, run_id, 10), _checkpoint(store, trial_id, run_id, 20)
    bob = store.user_id("bob")
    team = store.create_workspace("team", bob).id
    store.create_model("m", owner_id=bob, workspace_id=team)
    store.register_version("m", kept, user_id=bob)
    store.register_version("m", lost, user_id=bob)
    store.set_checkpoint_state(lost, "DELETED")

    _downgrade(store.engine, "0012")
    with store.engine.connect() as c:
        assert "workspace_id" not in {col["name"] for col in sa_inspect(c).get_columns("models")}
        rows = c.execute(text("SELECT version, checkpoint_uuid FROM model_versions")).all()
    # A version whose checkpoint is gone cannot stand under the old foreign key.
    assert [tuple(r) for r in rows] == [(1, kept)]

    assert migrate(store.engine) == head_revision()
    model = store.get_model("m")
    assert (model.workspace, model.num_versions) == ("Default", 1)
    assert store.get_version("m", 1).checkpoint_deleted_at is None
    assert store.checkpoint_pins([kept]) == {kept: [("m", 1)]}
