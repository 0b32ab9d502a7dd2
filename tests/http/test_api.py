"""Every route of the HTTP API against a real master with a real, finished experiment."""

from __future__ import annotations

import subprocess
import sys

import pytest

from assay.errors import AssayError
from assay.master.api import HttpServer
from tests.http.conftest import Site, World, serve


def test_health_and_master_info(world: World) -> None:
    site = world.site
    assert site.get("/api/v1/health").json() == {"status": "ok"}
    info = site.get("/api/v1/master")
    assert info.status == 200
    assert info.headers["Content-Type"].startswith("application/json")
    body = info.json()
    assert body["store"] == "sqlite"
    assert body["agents"] == 1
    assert body["slots"] == 1
    assert body["queued_trials"] == 0  # printed although it is the default


def test_list_experiments_filters_sorts_and_pages(world: World) -> None:
    site = world.site
    everything = site.get("/api/v1/experiments").json()
    assert everything["total"] == 2
    assert [e["id"] for e in everything["experiments"]] == [world.unstarted_id, world.experiment_id]
    oldest_first = site.get("/api/v1/experiments?ascending=true&sort_by=id").json()
    assert [e["id"] for e in oldest_first["experiments"]] == [
        world.experiment_id,
        world.unstarted_id,
    ]
    done = site.get("/api/v1/experiments?states=completed").json()
    assert [e["name"] for e in done["experiments"]] == ["finished"]
    assert done["experiments"][0]["state"] == "EXPERIMENT_STATE_COMPLETED"
    both = site.get("/api/v1/experiments?states=COMPLETED&states=EXPERIMENT_STATE_PAUSED").json()
    assert both["total"] == 2
    assert site.get("/api/v1/experiments?name=WAIT").json()["experiments"][0]["name"] == "waiting"
    assert site.get("/api/v1/experiments?label=web").json()["total"] == 1
    assert site.get("/api/v1/experiments?owner=nobody-at-all").json() == {
        "experiments": [],
        "total": 0,
    }
    page = site.get("/api/v1/experiments?limit=1&offset=1").json()
    assert page["total"] == 2
    assert [e["id"] for e in page["experiments"]] == [world.experiment_id]
    assert site.get("/api/v1/experiments?archived=true").json()["total"] == 0
    assert site.get("/api/v1/experiments?archived=false").json()["total"] == 2


def test_get_experiment_with_its_trials(world: World) -> None:
    body = world.site.get(f"/api/v1/experiments/{world.experiment_id}").json()
    experiment = body["experiment"]
    assert experiment["id"] == world.experiment_id  # a number: 64-bit ints unquoted
    assert experiment["name"] == "finished"
    assert experiment["labels"] == ["web"]
    assert experiment["config"]["searcher"]["name"] == "single"
    assert experiment["num_trials"] == 1
    assert isinstance(experiment["best_validation"], float)
    assert experiment["start_time"].endswith("Z")
    [trial] = body["trials"]
    assert trial["id"] == world.trial_id
    assert trial["state"] == "TRIAL_STATE_COMPLETED"
    assert trial["hparams"]["lr"] == 0.1


def test_experiment_metrics(world: World) -> None:
    path = f"/api/v1/experiments/{world.experiment_id}/metrics?name=loss&group=validation"
    [curve] = world.site.get(path + "&max_points=10").json()["curves"]
    assert curve["trial_id"] == world.trial_id
    assert curve["total_batches"] == [100]
    assert curve["values"] == [pytest.approx(0.11)]
    nothing = world.site.get(f"/api/v1/experiments/{world.experiment_id}/metrics?name=nope")
    empty = {"trial_id": world.trial_id, "total_batches": [], "values": []}
    assert nothing.json() == {"curves": [empty]}  # every field printed, even empty ones


def test_trial_and_its_metrics(world: World) -> None:
    trial = world.site.get(f"/api/v1/trials/{world.trial_id}").json()
    assert trial["experiment_id"] == world.experiment_id
    assert trial["total_batches"] == 100
    assert trial["latest_checkpoint"] in world.checkpoints
    metrics = world.site.get(f"/api/v1/trials/{world.trial_id}/metrics?group=validation")
    assert metrics.json() == {
        "reports": [{"total_batches": 100, "metrics": {"loss": pytest.approx(0.11)}}]
    }
    training = world.site.get(f"/api/v1/trials/{world.trial_id}/metrics?group=training")
    assert training.json() == {"reports": []}


def test_logs_without_follow(world: World) -> None:
    site, tid, ids = world.site, world.trial_id, world.log_ids
    lines = site.get(f"/api/v1/trials/{tid}/logs").json()
    assert [line["message"] for line in lines] == [f"line {i}" for i in range(5)]
    assert [line["id"] for line in lines] == ids
    assert lines[3]["level"] == "ERROR"
    assert lines[0]["trial_id"] == tid
    after = site.get(f"/api/v1/trials/{tid}/logs?after_id={ids[2]}").json()
    assert [line["message"] for line in after] == ["line 3", "line 4"]
    tail = site.get(f"/api/v1/trials/{tid}/logs?tail=2&follow=false").json()
    assert [line["message"] for line in tail] == ["line 3", "line 4"]
    assert site.get(f"/api/v1/trials/{tid}/logs?after_id={ids[-1]}").json() == []


def test_checkpoints_of_an_experiment_or_a_trial(world: World) -> None:
    site = world.site
    by_experiment = site.get(f"/api/v1/checkpoints?experiment_id={world.experiment_id}").json()
    assert {c["uuid"] for c in by_experiment["checkpoints"]} == set(world.checkpoints)
    by_trial = site.get(f"/api/v1/checkpoints?trial_id={world.trial_id}").json()
    assert by_trial == by_experiment
    [checkpoint] = by_trial["checkpoints"]
    assert checkpoint["state"] == "CHECKPOINT_STATE_COMPLETED"
    assert checkpoint["total_batches"] == 100
    for query in ("", f"?experiment_id={world.experiment_id}&trial_id={world.trial_id}"):
        refused = site.get("/api/v1/checkpoints" + query)
        assert refused.status == 400
        assert "experiment_id or trial_id" in refused.json()["error"]


def test_agents(world: World) -> None:
    [agent] = world.site.get("/api/v1/agents").json()["agents"]
    assert agent["id"] == "agent-1"
    assert agent["connected"] is True
    assert agent["slot_type"] == "SLOT_TYPE_CPU"
    assert [s["index"] for s in agent["slots"]] == [0]


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/experiments/999999",
        "/api/v1/experiments/999999/metrics?name=loss",
        "/api/v1/trials/999999",
        "/api/v1/trials/999999/metrics",
        "/api/v1/trials/999999/logs",
        "/api/v1/trials/999999/logs?follow=true",
        "/api/v1/checkpoints?trial_id=999999",
        "/api/v1/checkpoints?experiment_id=999999",
    ],
)
def test_unknown_ids_are_404_with_a_json_error(world: World, path: str) -> None:
    reply = world.site.get(path)
    assert reply.status == 404
    assert reply.headers["Content-Type"].startswith("application/json")
    assert "999999" in reply.json()["error"]


def test_unknown_routes_and_methods(world: World) -> None:
    site = world.site
    for path in ("/api/v1/nothing", "/api/v2/experiments", "/api", "/api/v1/experiments/"):
        reply = site.get(path)
        assert reply.status == 404, path
        assert "no such route" in reply.json()["error"]
    wrong = site.post("/api/v1/agents")
    assert wrong.status == 405
    assert wrong.headers["Allow"] == "GET"
    assert "GET" in wrong.json()["error"]
    assert site.call("DELETE", f"/api/v1/experiments/{world.experiment_id}/pause").status == 405
    assert site.call("DELETE", "/api/v1/experiments/999999").status == 404  # DeleteExperiment
    assert site.get(f"/api/v1/experiments/{world.experiment_id}/pause").status == 405


def test_no_cors_headers(world: World) -> None:
    reply = world.site.get("/api/v1/experiments", headers={"Origin": "http://elsewhere.example"})
    assert reply.status == 200
    assert "Access-Control-Allow-Origin" not in reply.headers
    assert reply.headers["X-Content-Type-Options"] == "nosniff"
    preflight = world.site.call(
        "OPTIONS",
        f"/api/v1/experiments/{world.experiment_id}/pause",
        headers={"Origin": "http://elsewhere.example", "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status == 405
    assert "Access-Control-Allow-Origin" not in preflight.headers


def test_the_cli_does_not_import_aiohttp() -> None:
    code = "import sys, assay.cli.main; assert 'aiohttp' not in sys.modules, 'aiohttp imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_port_in_use_is_a_clear_error(world: World) -> None:
    taken = world.site.server.port
    with pytest.raises(AssayError, match=f"cannot serve HTTP on 127.0.0.1:{taken}"):
        world.site.master.loop.call(
            lambda: HttpServer(
                object(), world.site.master.pool, "127.0.0.1", taken, world.site.master.guard
            ).start()
        )


def test_port_zero_picks_a_free_port(site: Site) -> None:
    second = serve(site.master)
    try:
        assert second.port not in (0, site.server.port)
        reply = site.get("/api/v1/health")
        assert reply.status == 200
    finally:
        site.master.loop.call(second.stop)
