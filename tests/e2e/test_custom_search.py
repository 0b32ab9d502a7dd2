"""End to end: a custom searcher (`searcher.name: custom`) driven from this test process
through the SDK, on a real master and agent, across a restart of each.

The search: three trials of the regression fixture with three learning rates train 4
batches; once all three have validated, the best trains on to 8 batches and the other two
are closed; when it validates again the search shuts down. The master is killed and
restarted as soon as the trials exist, and the first runner dies at the second validation
it is told of; a second runner, a new object in a new thread, attaches to the experiment,
loads the state the first saved with its last accepted batch, and finishes the search.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from assay import client
from assay.client import searcher
from tests.conftest import REGRESSION_DIR, regression_config
from tests.credentials import ADMIN_PASSWORD
from tests.e2e.conftest import Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slow

WAIT_S = 300
RATES = (0.05, 0.02, 0.001)


class ExtendTheBest(searcher.SearchMethod):
    """Three trials of 4 batches; the best goes on to 8, the others close."""

    def __init__(self, crash_at: int | None = None) -> None:
        self.lr: dict[str, float] = {}
        self.results: dict[str, float] = {}
        self.told: list[tuple[str, int]] = []  # every validation this object was told
        self.crash_at = crash_at
        self.loaded: dict[str, float] = {}  # the results load_method_state found

    def initial_operations(self, state: searcher.SearcherState) -> list[searcher.Operation]:
        ops: list[searcher.Operation] = []
        for lr in RATES:
            create = searcher.Create(hparams={"lr": lr})
            self.lr[str(create.request_id)] = lr
            ops += [create, searcher.ValidateAfter(create.request_id, 4)]
        return ops

    def on_validation_completed(
        self, state: searcher.SearcherState, request_id: str, metric: float, train_length: int
    ) -> list[searcher.Operation]:
        self.told.append((request_id, train_length))
        if self.crash_at is not None and len(self.told) >= self.crash_at:
            raise RuntimeError("the runner dies here")
        if train_length == 8:
            return [searcher.Shutdown()]
        self.results[request_id] = metric
        if len(self.results) < len(RATES):
            return []
        best = min(self.results, key=self.results.__getitem__)
        others = [searcher.Close(rid) for rid in sorted(self.results) if rid != best]
        return [searcher.ValidateAfter(best, 8), *others]

    def on_trial_exited_early(
        self, state: searcher.SearcherState, request_id: str, exited_reason: str
    ) -> list[searcher.Operation]:
        raise AssertionError(f"trial {request_id} exited early: {exited_reason}")

    def progress(self, state: searcher.SearcherState) -> float:
        return len(state.trial_progress) / (len(RATES) + 1)

    def save_method_state(self, path: Path) -> None:
        (path / "state.json").write_text(json.dumps({"lr": self.lr, "results": self.results}))

    def load_method_state(self, path: Path) -> None:
        saved = json.loads((path / "state.json").read_text())
        self.lr, self.results = saved["lr"], saved["results"]
        self.loaded = dict(self.results)


@pytest.fixture
def restartable(tmp_path: Path) -> Any:
    env = {"ASSAY_AGENT_RECONNECT_WAIT_S": "15", "ASSAY_HEARTBEAT_INTERVAL_S": "1"}
    cluster = start_cluster(tmp_path, None, agents=1, slots=3, master_env=env)
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


def _run(runner: searcher.RemoteSearchRunner, outcome: dict[str, Any], **kwargs: Any) -> None:
    try:
        outcome["experiment_id"] = runner.run(**kwargs)
    except BaseException as e:
        outcome["error"] = e


@pytest.mark.timeout(WAIT_S + 120)
def test_a_custom_searcher_survives_a_master_and_a_runner_restart(
    restartable: Cluster, tmp_path: Path
) -> None:
    cluster = restartable
    session = client.login(cluster.address, "admin", ADMIN_PASSWORD)
    config: dict[str, Any] = regression_config(batches=8, global_batch_size=8)
    config["hyperparameters"]["lr"] = {"type": "double", "minval": 0.001, "maxval": 0.1}
    config["searcher"] = {"name": "custom", "metric": "val_loss", "max_trials": 3}
    path = tmp_path / "custom.yaml"
    path.write_text(json.dumps(config))
    plan = cluster.json("preview-search", str(path))
    assert (plan["searcher"], plan["plan"]) == ("custom", "user code")

    first = ExtendTheBest(crash_at=2)
    runner = searcher.RemoteSearchRunner(first, session=session, poll_seconds=0.2)
    outcome: dict[str, Any] = {}
    thread = threading.Thread(
        target=_run, args=(runner, outcome), kwargs={"config": config, "model_dir": REGRESSION_DIR}
    )
    thread.start()
    deadline = time.monotonic() + 120
    while runner.experiment_id is None or not session.get_experiment(runner.experiment_id).trials():
        assert thread.is_alive(), (outcome, cluster.dump_logs())
        assert time.monotonic() < deadline, cluster.dump_logs()
        time.sleep(0.2)
    eid = runner.experiment_id
    # The master dies with the search under way; the runner waits for it and goes on.
    cluster.procs[0].send_signal(signal.SIGKILL)
    cluster.procs[0].wait()
    cluster.restart_master()
    thread.join(WAIT_S)
    assert isinstance(outcome.get("error"), RuntimeError), (outcome, cluster.dump_logs())
    assert session.get_experiment(eid).state == "ACTIVE"  # it waits for a runner
    assert len(first.told) == 2

    second = ExtendTheBest()
    again = searcher.RemoteSearchRunner(second, session=session, poll_seconds=0.2)
    outcome = {}
    thread = threading.Thread(target=_run, args=(again, outcome), kwargs={"experiment_id": eid})
    thread.start()
    thread.join(WAIT_S)
    assert outcome.get("experiment_id") == eid, (outcome, cluster.dump_logs())

    experiment = session.get_experiment(eid)
    assert (experiment.state, experiment.progress) == ("COMPLETED", 1.0), cluster.dump_logs()
    # The second runner began with the state of the first's last accepted batch: the
    # trials it created and the validations that batch answered; it was told the rest,
    # none twice, then the best one's second validation.
    assert second.lr == first.lr
    assert [rid for rid, _ in first.told[: len(second.loaded)]] == list(second.loaded)
    retold = [rid for rid, length in second.told if length == 4]
    assert sorted([*second.loaded, *retold]) == sorted(first.lr)
    best_id = min(second.results, key=second.results.__getitem__)
    assert second.told[-1] == (best_id, 8)
    assert len(second.told) == len(retold) + 1
    trials = {t.hparams["lr"]: t for t in experiment.trials()}
    assert sorted(trials) == sorted(RATES)
    assert all(t.state == "COMPLETED" for t in trials.values())
    best_lr = first.lr[best_id]
    lengths = {lr: t.total_batches for lr, t in trials.items()}
    assert lengths == {lr: 8 if lr == best_lr else 4 for lr in RATES}
    best = min(trials.values(), key=lambda t: t.best_validation or float("inf"))
    assert best.hparams["lr"] == best_lr
