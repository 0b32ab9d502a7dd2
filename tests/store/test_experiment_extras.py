"""Experiment names, descriptions and labels set after creation, and experiment templates,
on SQLite and PostgreSQL alike."""

from __future__ import annotations

import pytest

from assay.master.errors import ConflictError, InvalidArgumentError, NotFoundError
from assay.master.store import Store
from tests.store import _seed as seed


def test_patch_experiment_sets_what_is_given_and_is_idempotent(store: Store) -> None:
    eid = seed.experiment(store, name="a", description="d", labels=["x", "y"])
    store.patch_experiment(eid, name="b")
    e = store.get_experiment(eid)
    assert (e.name, e.description, e.labels) == ("b", "d", ("x", "y"))
    for _ in range(2):
        store.patch_experiment(eid, description="", add_labels=["z", "x"], remove_labels=["y"])
    e = store.get_experiment(eid)
    assert (e.name, e.description, e.labels) == ("b", "", ("x", "z"))
    store.patch_experiment(eid, labels=["q"], add_labels=["r"], remove_labels=["q", "nope"])
    assert store.get_experiment(eid).labels == ("r",)
    assert [x.id for x in store.list_experiments(label="r").items] == [eid]


def test_patch_experiment_refuses_too_many_labels_and_unknown_ids(store: Store) -> None:
    eid = seed.experiment(store, labels=["keep"])
    with pytest.raises(InvalidArgumentError, match="at most 64"):
        store.patch_experiment(eid, add_labels=[f"l{i}" for i in range(64)])
    assert store.get_experiment(eid).labels == ("keep",)
    with pytest.raises(NotFoundError, match="experiment 9999 does not exist"):
        store.patch_experiment(9999, name="x")


def test_templates_round_trip(store: Store) -> None:
    owner = store.user_id("alice")
    store.create_template("small", {"searcher": {"max_length": {"batches": 4}}}, owner_id=owner)
    store.create_template("a-first", {"resources": {"slots_per_trial": 2}}, owner_id=owner)
    found = store.get_template("small")
    assert (found.name, found.owner, found.config) == (
        "small",
        "alice",
        {"searcher": {"max_length": {"batches": 4}}},
    )
    assert [t.name for t in store.list_templates()] == ["a-first", "small"]
    with pytest.raises(ConflictError, match="exists already"):
        store.create_template("small", {"name": "other"}, owner_id=owner)
    assert store.get_template("small").config == {"searcher": {"max_length": {"batches": 4}}}
    with pytest.raises(InvalidArgumentError, match="not allowed"):
        store.create_template("no spaces", {"name": "x"}, owner_id=owner)
    store.delete_template("small")
    with pytest.raises(NotFoundError, match="template 'small' does not exist"):
        store.get_template("small")
    with pytest.raises(NotFoundError):
        store.delete_template("small")
    assert [t.name for t in store.list_templates()] == ["a-first"]
