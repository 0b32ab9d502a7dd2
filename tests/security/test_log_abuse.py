"""Logs a hostile or careless user could abuse, on a real `assay-master` and `assay-agent`:
a tail of a long log, a flood beside another user's quiet trial on the same agent, a
trial over its log quota, and more followers than a user may hold.

The master runs with a 2 MB log quota and 2 followers per user so that each attack is
over its bound within seconds.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from assay.common.archive import pack_model_dir
from assay.master.store._logs import QUOTA_MARKER
from assay.proto import api_pb2, common_pb2
from tests.credentials import authed_api, login
from tests.e2e.conftest import Cluster, start_cluster, stop_cluster

PASSWORDS = {"alice": "alice-pass-1234", "bob": "bob-pass-12345"}
QUOTA_MB = 2
FOLLOWERS = 2
LONG_LOG = 120_000  # lines: more than the 100,000 a tail once read from the start
FLOOD = 400_000
QUIET = 2_000
WAIT_S = 120
ENDED = {
    common_pb2.TRIAL_STATE_COMPLETED,
    common_pb2.TRIAL_STATE_ERROR,
    common_pb2.TRIAL_STATE_CANCELED,
}

SCRIPTS = {
    "long": f"for i in range({LONG_LOG}):\n    print(f'line {{i:06d}}')\n",
    "flood": (
        f"import sys\nfor i in range({FLOOD}):\n    sys.stdout.write(f'flood {{i:07d}}\\n')\n"
    ),
    "quiet": (
        "import time\n"
        f"for i in range({QUIET}):\n"
        "    print(f'quiet {i:05d}', flush=True)\n"
        "    if i % 100 == 0:\n"
        "        time.sleep(0.1)\n"
    ),
    "sleeper": "import time\nfor i in range(600):\n    print(i, flush=True)\n    time.sleep(0.5)\n",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(
        tmp_path_factory.mktemp("logs"),
        None,
        agents=1,
        slots=3,
        master_env={
            "ASSAY_LOG_QUOTA_MB": str(QUOTA_MB),
            "ASSAY_LOG_FOLLOWERS_PER_USER": str(FOLLOWERS),
        },
    )
    try:
        api, channel = authed_api(c.address)
        with channel:
            for name, password in PASSWORDS.items():
                request = api_pb2.CreateUserRequest(username=name, password=password)
                api.CreateUser(request, timeout=30)
        yield c
    finally:
        stop_cluster(c)


@pytest.fixture(scope="module")
def tokens(cluster: Cluster) -> dict[str, str]:
    return {name: login(cluster.address, name, pw) for name, pw in PASSWORDS.items()}


def _submit(cluster: Cluster, token: str, script: str, tmp: Path) -> int:
    """Start a one-trial experiment that runs `script`; return its trial's id."""
    model = tmp / script
    model.mkdir(exist_ok=True)
    (model / f"{script}.py").write_text(SCRIPTS[script])
    config = {
        "name": f"logs-{script}",
        "entrypoint": f"python3 {script}.py",
        "searcher": {"name": "single", "metric": "x", "max_length": {"batches": 1}},
        "max_restarts": 0,
    }
    api, channel = authed_api(cluster.address, token)
    with channel:
        request = api_pb2.CreateExperimentRequest(
            config_yaml=yaml.safe_dump(config),
            model_definition=pack_model_dir(model),
            activate=True,
        )
        experiment = api.CreateExperiment(request, timeout=60).experiment
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            trials = api.GetExperiment(api_pb2.GetExperimentRequest(id=experiment.id)).trials
            if trials:
                return int(trials[0].id)
            time.sleep(0.2)
    raise AssertionError(f"experiment {experiment.id} made no trial\n{cluster.dump_logs()}")


def _wait_ended(cluster: Cluster, token: str, trial_id: int) -> None:
    api, channel = authed_api(cluster.address, token)
    with channel:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            state = api.GetTrial(api_pb2.GetTrialRequest(id=trial_id), timeout=30).state
            if state in ENDED:
                return
            time.sleep(0.5)
    raise AssertionError(f"trial {trial_id} did not end\n{cluster.dump_logs()}")


def _get(cluster: Cluster, token: str, path: str) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", cluster.http_port, timeout=120)
    try:
        connection.request("GET", f"/api/v1{path}", headers={"Authorization": f"Bearer {token}"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def _logs(cluster: Cluster, token: str, trial_id: int, query: str = "") -> list[dict[str, Any]]:
    status, lines = _get(cluster, token, f"/trials/{trial_id}/logs?{query}")
    assert status == 200, lines
    return list(lines)


def _user_lines(lines: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    return [line for line in lines if line["message"].startswith(prefix)]


# --- a tail of a long log -------------------------------------------------------------------


def test_a_tail_is_the_last_lines_of_a_long_log(
    cluster: Cluster, tokens: dict[str, str], tmp_path: Path
) -> None:
    alice = tokens["alice"]
    trial_id = _submit(cluster, alice, "long", tmp_path)
    _wait_ended(cluster, alice, trial_id)

    started = time.monotonic()
    tail = _logs(cluster, alice, trial_id, "tail=1")
    took = time.monotonic() - started
    assert len(tail) == 1, f"{len(tail)} lines for tail=1"
    assert took < 5, f"tail=1 took {took:.1f} s"

    tail = _logs(cluster, alice, trial_id, "tail=50")
    ids = [int(line["id"]) for line in tail]
    assert len(ids) == 50
    assert _logs(cluster, alice, trial_id, f"after_id={ids[-1]}") == []  # nothing after it
    assert _logs(cluster, alice, trial_id, f"after_id={ids[0] - 1}") == tail  # none between
    assert f"line {LONG_LOG - 1:06d}" in [line["message"] for line in tail]

    shown = cluster.cli("trial", "logs", str(trial_id), "--tail", "3")
    assert shown.returncode == 0, shown.stderr
    assert len(shown.stdout.splitlines()) == 3, shown.stdout[-2000:]
    assert tail[-1]["message"] in shown.stdout


# --- a flood beside a quiet trial, and the quota ----------------------------------------------


@pytest.fixture(scope="module")
def flooded(
    cluster: Cluster, tokens: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[dict[str, Any]]]:
    """alice floods while bob's quiet trial runs on the same agent; both logs, once ended."""
    tmp = tmp_path_factory.mktemp("flood")
    flood = _submit(cluster, tokens["alice"], "flood", tmp)
    quiet = _submit(cluster, tokens["bob"], "quiet", tmp)
    _wait_ended(cluster, tokens["alice"], flood)
    _wait_ended(cluster, tokens["bob"], quiet)
    time.sleep(1)
    return {
        "flood": _logs(cluster, tokens["alice"], flood),
        "quiet": _logs(cluster, tokens["bob"], quiet),
    }


def _gaps_marked(lines: list[dict[str, Any]], prefix: str, total: int) -> int:
    """Check that every line missing before the quota is where a marker says how many went;
    return how many of the user's lines were kept."""
    expected = 0
    dropped = 0
    for line in lines:
        message = line["message"]
        if message.startswith(QUOTA_MARKER):
            break
        if message.startswith("assay-agent:"):
            assert line["stream"] == "assay", line
            dropped = int(message.split()[1])
            continue
        if not message.startswith(prefix):
            continue
        number = int(message.split()[1])
        assert number == expected + dropped, f"{prefix}: line {number} after {expected - 1}"
        expected, dropped = number + 1, 0
    assert expected <= total
    return expected


def test_a_flood_takes_no_lines_from_another_users_quiet_trial(
    flooded: dict[str, list[dict[str, Any]]],
) -> None:
    quiet = flooded["quiet"]
    _gaps_marked(quiet, "quiet ", QUIET)
    kept = _user_lines(quiet, "quiet ")
    assert [line["message"] for line in kept] == [f"quiet {i:05d}" for i in range(QUIET)]
    _gaps_marked(flooded["flood"], "flood ", FLOOD)  # the flood's own gaps are marked


def test_a_trial_over_its_quota_stores_its_quota_and_one_marker(
    flooded: dict[str, list[dict[str, Any]]],
) -> None:
    lines = flooded["flood"]
    markers = [line for line in lines if line["message"].startswith(QUOTA_MARKER)]
    assert len(markers) == 1, f"{len(markers)} quota markers"
    assert markers[0]["stream"] == "assay"
    # The master's own lines (how the trial ended) are not the user's: not counted.
    stored = sum(len(line["message"].encode()) for line in lines if line["stream"] == "stdout")
    assert stored <= QUOTA_MB * 2**20
    assert stored > QUOTA_MB * 2**20 * 0.9
    assert len(_user_lines(lines, "flood ")) < FLOOD


# --- followers ------------------------------------------------------------------------------


class _Follower:
    """An open server-sent-events follow of a trial's log."""

    def __init__(self, cluster: Cluster, token: str, trial_id: int) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", cluster.http_port, timeout=60)
        self.connection.request(
            "GET",
            f"/api/v1/trials/{trial_id}/logs?follow=true",
            headers={"Authorization": f"Bearer {token}", "Accept": "text/event-stream"},
        )
        self.response = self.connection.getresponse()
        self.status = self.response.status
        self.body = self.response.read().decode() if self.status != 200 else ""

    def close(self) -> None:
        self.connection.close()


def test_a_user_follows_a_bounded_number_of_logs(
    cluster: Cluster, tokens: dict[str, str], tmp_path: Path
) -> None:
    alice, bob = tokens["alice"], tokens["bob"]
    trial_id = _submit(cluster, alice, "sleeper", tmp_path)
    followers: list[_Follower] = []
    try:
        followers = [_Follower(cluster, alice, trial_id) for _ in range(FOLLOWERS)]
        assert [f.status for f in followers] == [200] * FOLLOWERS
        time.sleep(0.5)  # the streams hold their slots once they have started

        over = _Follower(cluster, alice, trial_id)
        followers.append(over)
        assert over.status == 429, over.body
        assert "log_followers_per_user" in over.body
        api, channel = authed_api(cluster.address, alice)
        with channel:
            stream = api.StreamTrialLogs(
                api_pb2.StreamTrialLogsRequest(trial_id=trial_id, follow=True), timeout=30
            )
            with pytest.raises(grpc.RpcError) as refused:
                next(iter(stream))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "end one" in (refused.value.details() or "")

        other = _Follower(cluster, bob, trial_id)  # admin-free: bob reads alice's trial
        followers.append(other)
        assert other.status == 200  # the bound is per user

        followers[0].close()
        deadline = time.monotonic() + 10
        again = _Follower(cluster, alice, trial_id)
        while again.status == 429 and time.monotonic() < deadline:
            time.sleep(0.5)  # the server notices the closed stream within a poll
            again = _Follower(cluster, alice, trial_id)
        followers.append(again)
        assert again.status == 200, again.body
    finally:
        for f in followers:
            f.close()
        api, channel = authed_api(cluster.address, alice)
        with channel:
            trial = api.GetTrial(api_pb2.GetTrialRequest(id=trial_id), timeout=30)
            api.ExperimentAction(
                api_pb2.ExperimentActionRequest(
                    id=trial.experiment_id, action=api_pb2.EXPERIMENT_ACTION_KILL
                ),
                timeout=30,
            )
