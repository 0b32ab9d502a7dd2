"""`POST /api/v1/experiments/{id}/set/{name}` and the queue's positions and reasons."""

from __future__ import annotations

import json
from typing import Any

from tests.http.conftest import Site


def _set(site: Site, experiment_id: int, name: str, value: object) -> tuple[int, Any]:
    reply = site.post(
        f"/api/v1/experiments/{experiment_id}/set/{name}",
        json.dumps({"value": value}).encode(),
        headers={"Content-Type": "application/json"},
    )
    return reply.status, reply.json()


def test_set_changes_the_experiment_and_reorders_the_queue(site: Site) -> None:
    first = site.create(name="first", resources={"priority": 30})
    second = site.create(name="second", resources={"priority": 40})
    queue = site.get("/api/v1/queue").json()["trials"]
    assert [q["experiment_id"] for q in queue] == [first, second]
    assert [q["position"] for q in queue] == [1, 2]
    assert {q["wait_kind"] for q in queue} == {"too_large"}  # no agent at all
    status, answer = _set(site, second, "priority", "5")
    assert status == 200, answer
    assert answer["priority"] == 5
    queue = site.get("/api/v1/queue").json()["trials"]
    assert [q["experiment_id"] for q in queue] == [second, first]
    status, answer = _set(site, first, "weight", "4")
    assert status == 200, answer
    assert answer["config"]["resources"]["weight"] == 4


def test_bad_values_are_400_and_unknown_experiments_404(site: Site) -> None:
    eid = site.create(name="x")
    status, answer = _set(site, eid, "max-slots", "0")
    assert status == 400
    assert "max-slots must be an integer of at least 1, got 0" in answer["error"]
    status, answer = _set(site, eid, "colour", "blue")
    assert status == 400
    assert "cannot set 'colour'" in answer["error"]
    status, answer = _set(site, 424242, "priority", "3")
    assert status == 404
