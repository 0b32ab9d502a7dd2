"""POST /api/v1/experiments/{id}/{action}: the store changes; bad calls are refused."""

from __future__ import annotations

import json

from tests.http.conftest import Site


def test_pause_activate_kill_archive_change_the_store(site: Site) -> None:
    eid = site.create(activate=True)
    store = site.master.store
    assert store.get_experiment(eid).state == "ACTIVE"
    paused = site.post(f"/api/v1/experiments/{eid}/pause")
    assert paused.status == 200, paused.body
    assert paused.json()["state"] == "EXPERIMENT_STATE_PAUSED"
    assert store.get_experiment(eid).state == "PAUSED"
    # A JSON body is accepted (and ignored); so is one from this host's own page.
    same_site = {"Origin": site.base, "Content-Type": "application/json"}
    active = site.post(f"/api/v1/experiments/{eid}/ACTIVATE", b"{}", same_site)
    assert active.status == 200, active.body
    assert store.get_experiment(eid).state == "ACTIVE"
    killed = site.post(f"/api/v1/experiments/{eid}/kill")
    assert killed.status == 200
    assert store.get_experiment(eid).state in ("STOPPING_KILLED", "CANCELED")
    assert site.post(f"/api/v1/experiments/{eid}/archive").json()["archived"] is True
    assert store.get_experiment(eid).archived
    assert site.post(f"/api/v1/experiments/{eid}/unarchive").json()["archived"] is False
    assert not store.get_experiment(eid).archived


def test_an_action_that_does_not_apply_is_409(site: Site) -> None:
    eid = site.create(activate=False)
    before = site.master.store.get_experiment(eid)
    refused = site.post(f"/api/v1/experiments/{eid}/pause")
    assert refused.status == 409
    assert "cannot pause" in refused.json()["error"]
    assert site.master.store.get_experiment(eid) == before


def test_bad_actions_ids_origins_and_bodies(site: Site) -> None:
    eid = site.create(activate=True)
    unknown = site.post(f"/api/v1/experiments/{eid}/explode")
    assert unknown.status == 400
    error = unknown.json()["error"]
    assert "'action'" in error
    assert "pause, activate, cancel, kill, archive, unarchive" in error
    assert site.post("/api/v1/experiments/999999/pause").status == 404
    assert site.post("/api/v1/experiments/abc/pause").status == 400
    other = site.post(f"/api/v1/experiments/{eid}/kill", headers={"Origin": "http://evil.example"})
    assert other.status == 403
    assert "evil.example" in other.json()["error"]
    fetched = site.post(f"/api/v1/experiments/{eid}/kill", headers={"Sec-Fetch-Site": "cross-site"})
    assert fetched.status == 403
    huge = site.post(f"/api/v1/experiments/{eid}/kill", json.dumps({"x": "y" * 2**20}).encode())
    assert huge.status == 413
    assert "bytes" in huge.json()["error"]
    assert site.post(f"/api/v1/experiments/{eid}/pause?force=1").status == 400
    assert site.master.store.get_experiment(eid).state == "ACTIVE"  # none of it acted
