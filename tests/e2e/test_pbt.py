"""End to end: population-based training on a real master and two agents.

Four trials of the regression fixture train three rounds of 4 batches; after rounds 0 and
1 the worst trial is closed and replaced by a copy of the best, which starts from the best
one's checkpoint. The searched hyperparameter does not change training (only `lr` does,
and it is constant; dropout is 0 and the data are not shuffled), so a copy that really
continues its parent's weights, optimizer state and data position validates exactly as
its parent does at the end of the next round. A copy that started over would not.

The second test kills the master (SIGKILL) in round 1 and restarts it on the same
database: the restored searcher finishes the same search, with its lineage whole.
"""

from __future__ import annotations

import contextlib
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from assay.client import Client, MasterError
from assay.proto import common_pb2
from tests.conftest import REGRESSION_DIR, regression_config
from tests.e2e.conftest import SCRIPTS, Cluster, loop_config, start_cluster, stop_cluster

pytestmark = pytest.mark.slow

WAIT_S = 480
ROUND = 4
ENDS = (ROUND, 2 * ROUND, 3 * ROUND)  # the batch counts at which the rounds end


@pytest.fixture(scope="module")
def pbt_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("pbt"), None, agents=2, slots=1)
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


@pytest.fixture(scope="module")
def api(pbt_cluster: Cluster) -> Iterator[Client]:
    """Reads in this process (a CLI process takes a second or more to start)."""
    client = Client(pbt_cluster.address)
    yield client
    client.close()


def _validations(api: Client, trial_id: int) -> dict[int, float]:
    reports = api.get_trial_metrics(trial_id, "validation").reports
    return {int(r.total_batches): float(r.metrics["val_loss"]) for r in reports}


def _validations_in_order(api: Client, trial_id: int) -> list[tuple[int, float]]:
    """Every validation report, as stored (a duplicate would show twice)."""
    reports = api.get_trial_metrics(trial_id, "validation").reports
    return [(int(r.total_batches), float(r.metrics["val_loss"])) for r in reports]


def _training_batches(api: Client, trial_id: int) -> list[int]:
    return [int(r.total_batches) for r in api.get_trial_metrics(trial_id, "training").reports]


def _pbt_config() -> dict[str, Any]:
    config: dict[str, Any] = regression_config(batches=ROUND, global_batch_size=8)
    config["hyperparameters"]["unused"] = {"type": "double", "minval": 0.1, "maxval": 0.9}
    config["searcher"] = {
        "name": "pbt",
        "metric": "val_loss",
        "population_size": 4,
        "num_rounds": 3,
        "length_per_round": {"batches": ROUND},
        "replace_function": {"truncate_fraction": 0.25},
        "explore_function": {"resample_probability": 0.5, "perturb_factor": 0.2},
    }
    return config


def _completed_search(cluster: Cluster, config: Path, model_dir: Path) -> dict[int, Any]:
    """Run the search to its end; its 6 trials (4, then a copy in each of rounds 1 and 2)
    by id, the experiment COMPLETED."""
    experiment_id = str(cluster.json("experiment", "create", str(config), str(model_dir))["id"])
    waited = cluster.cli(
        "experiment", "wait", experiment_id, "--timeout", str(WAIT_S), timeout=WAIT_S + 60
    )
    assert waited.returncode == 0, f"{waited.stdout}\n{waited.stderr}\n{cluster.dump_logs()}"
    described: dict[str, Any] = cluster.json("experiment", "describe", experiment_id)
    assert described["state"] == "COMPLETED", cluster.dump_logs()
    trials = {int(t["id"]): t for t in described["trials"]}
    assert len(trials) == 6, trials
    return trials


@pytest.mark.timeout(WAIT_S + 120)
def test_pbt_copies_the_best_checkpoint_and_records_the_lineage(
    pbt_cluster: Cluster, api: Client, tmp_path: Path
) -> None:
    cluster = pbt_cluster
    path = tmp_path / "pbt.yaml"
    path.write_text(yaml.safe_dump(_pbt_config()))
    plan = cluster.json("preview-search", str(path))
    assert [r["new_trials"] for r in plan["rounds"]] == [4, 1, 1]

    trials = _completed_search(cluster, path, REGRESSION_DIR)
    assert all(t["state"] == "COMPLETED" for t in trials.values()), trials

    first = sorted(trials)[:4]
    copies = sorted(trials)[4:]
    assert all(trials[t]["parent_trial_id"] is None for t in first)
    assert [trials[t]["search_round"] for t in copies] == [1, 2]
    for copy_id in copies:
        copy = trials[copy_id]
        parent_id = copy["parent_trial_id"]
        assert parent_id in trials, copy
        assert parent_id < copy_id, copy
        start = copy["search_round"] * ROUND  # where its parent paused
        parent = _validations(api, parent_id)
        # The parent was the best of its round.
        round_values = [v for t in trials for b, v in _validations(api, t).items() if b == start]
        assert parent[start] == min(round_values)
        # The copy trained on from the parent's batch count, never from 0 ...
        training = _training_batches(api, copy_id)
        assert training, copy
        assert min(training) > start, training
        own = _validations(api, copy_id)
        assert min(own) == start + ROUND, own
        # ... and from its weights: both trained the same next round from one checkpoint.
        assert own[start + ROUND] == pytest.approx(parent[start + ROUND], rel=1e-6)
        detail = cluster.json("trial", "describe", str(copy_id))
        assert (detail["parent_trial_id"], detail["search_round"]) == (
            parent_id,
            copy["search_round"],
        )
        logs = cluster.cli("trial", "logs", str(copy_id)).stdout
        assert f"of trial {parent_id} at batch {start}" in logs, logs
    # Survivors and copies all reached the last round's length.
    assert sum(t["total_batches"] == 3 * ROUND for t in trials.values()) == 4


@pytest.mark.timeout(WAIT_S + 120)
def test_a_core_api_script_that_trains_to_max_length_lives_through_every_round(
    pbt_cluster: Cluster, api: Client, tmp_path: Path
) -> None:
    """A script trains to `info.trial.max_length`, checkpointing and checking
    should_preempt() every 4 batches: that length is the rounds together (12), not one
    round (4), so the survivors go on from their checkpoints each round (before, each
    exited at 4, before its next target, and the search ended after round 0)."""
    config = loop_config(every=ROUND, unused=0.5)
    config["hyperparameters"]["unused"] = {"type": "double", "minval": 0.1, "maxval": 0.9}
    config["searcher"] = {**_pbt_config()["searcher"], "metric": "value"}
    config["max_restarts"] = 0
    path = tmp_path / "pbt.yaml"
    path.write_text(yaml.safe_dump(config))
    trials = _completed_search(pbt_cluster, path, SCRIPTS)
    assert sum(t["total_batches"] == 3 * ROUND for t in trials.values()) == 4, trials
    for trial_id, trial in trials.items():
        if trial["parent_trial_id"] is None:
            continue
        start = trial["search_round"] * ROUND
        logs = pbt_cluster.cli("trial", "logs", str(trial_id)).stdout
        assert f"resumed at step {start}" in logs, logs
        assert min(_validations(api, trial_id)) == start + ROUND


@pytest.fixture
def restartable_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A cluster of its own: its master is killed, which the module's must not be."""
    env = {"ASSAY_HEARTBEAT_INTERVAL_S": "1"}
    cluster = start_cluster(
        tmp_path_factory.mktemp("restart"), None, agents=2, slots=1, master_env=env
    )
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


def _poll(what: str, check: Callable[[], bool], cluster: Cluster, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(MasterError):  # the master is restarting
            if check():
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout:.0f} s:\n{cluster.dump_logs()}")
        time.sleep(0.2)


@pytest.mark.timeout(WAIT_S + 120)
def test_pbt_survives_a_master_killed_in_the_middle_of_the_search(
    restartable_cluster: Cluster, tmp_path: Path
) -> None:
    """The master dies (SIGKILL) once round 0's exploit has made its copy and round 1
    trains; the restarted master restores the searcher from the store and runs rounds 1
    and 2 to the end: the same population, lineage and copied weights as without it."""
    cluster = restartable_cluster
    path = tmp_path / "pbt.yaml"
    path.write_text(yaml.safe_dump(_pbt_config()))
    eid = int(cluster.json("experiment", "create", str(path), str(REGRESSION_DIR))["id"])
    api = Client(cluster.address)
    try:
        before: dict[int, common_pb2.Trial] = {}

        def round_1_under_way() -> bool:
            trials = api.get_experiment(eid).trials
            before.clear()
            before.update({t.id: t for t in trials})
            copied = any(t.HasField("parent_trial_id") for t in trials)
            return copied and any(t.state == common_pb2.TRIAL_STATE_RUNNING for t in trials)

        _poll("round 1 under way", round_1_under_way, cluster, WAIT_S)
        cluster.procs[0].send_signal(signal.SIGKILL)
        cluster.procs[0].wait()
        # What the dead master had made: round 0's copy, not yet round 1's.
        assert sorted(t.search_round for t in before.values() if t.parent_trial_id) == [1]
        cluster.restart_master()

        def ended() -> bool:
            state = api.get_experiment(eid).experiment.state
            return state in (
                common_pb2.EXPERIMENT_STATE_COMPLETED,
                common_pb2.EXPERIMENT_STATE_CANCELED,
                common_pb2.EXPERIMENT_STATE_ERROR,
            )

        _poll("the end", ended, cluster, WAIT_S)
        done = api.get_experiment(eid)
        assert done.experiment.state == common_pb2.EXPERIMENT_STATE_COMPLETED, cluster.dump_logs()
        trials = {t.id: t for t in done.trials}
        # Nothing created twice, nothing lost: 4 trials, then one copy a round.
        assert len(trials) == 6, trials
        assert all(t.state == common_pb2.TRIAL_STATE_COMPLETED for t in trials.values())
        assert set(before) < set(trials)
        # A master that died is not the user's failure: no trial counts a restart.
        assert [t.restarts for t in trials.values()] == [0] * 6, cluster.dump_logs()
        validations = {t: _validations_in_order(api, t) for t in trials}
        for trial_id, batches in validations.items():
            # Each validation the searcher asked for once: none repeated after the restore.
            assert [b for b, _ in batches] == sorted({b for b, _ in batches}), (trial_id, batches)
        values = {t: dict(v) for t, v in validations.items()}
        # Each round's population: the trials that validated at its end, 4 and distinct.
        rounds = [[t for t in trials for b, _ in validations[t] if b == end] for end in ENDS]
        for members in rounds:
            assert len(members) == len(set(members)) == 4, rounds
        copies = sorted(t for t in trials if trials[t].HasField("parent_trial_id"))
        assert [trials[t].search_round for t in copies] == [1, 2]
        assert all(t in rounds[0] for t in trials if t not in copies)
        for copy_id in copies:
            copy = trials[copy_id]
            parent_id, round_ = copy.parent_trial_id, copy.search_round
            start = round_ * ROUND  # where the round its parent was best in ended
            assert copy_id in rounds[round_], rounds
            assert copy_id not in rounds[round_ - 1], rounds
            # The parent was a member of the round before, its best, and checkpointed there.
            assert parent_id in rounds[round_ - 1], (copy_id, parent_id, rounds)
            assert values[parent_id][start] == min(values[t][start] for t in rounds[round_ - 1])
            saved = {c.uuid: c.total_batches for c in api.list_checkpoints(eid, parent_id)}
            logs = "\n".join(line.message for line in api.stream_trial_logs(copy_id))
            uuid = re.search(rf"starts from checkpoint (\S+) of trial {parent_id} at batch", logs)
            assert uuid, logs
            assert saved.get(uuid[1]) == start, (saved, logs)
            # It trained on from there, and from the same weights as its parent.
            training = _training_batches(api, copy_id)
            assert training, copy_id
            assert min(training) > start, training
            assert min(values[copy_id]) == start + ROUND, values[copy_id]
            assert values[copy_id][start + ROUND] == pytest.approx(
                values[parent_id][start + ROUND], rel=1e-6
            )
        # The copy round 1's exploit made came from the restarted master's searcher.
        assert copies[1] not in before
    finally:
        api.close()
