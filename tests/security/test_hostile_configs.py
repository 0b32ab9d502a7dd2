"""A logged-in user's config must never crash the master or break another user's view.

One real master process per database (SQLite and PostgreSQL) serves the whole module.
`alice` (the victim) has an experiment; `mallory` (a regular user) submits hostile
configs over the real gRPC API. Each refusal is checked for its status and its message
(what to fix, and no database text); after each attack the master is still up, alice's
list and describe answer over gRPC and HTTP, and her experiment is as it was.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
import yaml
from google.protobuf.json_format import MessageToDict

from assay.master.store import Store, WriteBatch
from assay.proto import api_pb2, api_pb2_grpc
from tests.credentials import authed_api, login
from tests.e2e.conftest import Cluster, start_cluster, stop_cluster
from tests.master.conftest import experiment_yaml, model_archive
from tests.store.conftest import _empty_postgres, postgres_url  # noqa: F401 - a fixture

# What a database's error text looks like; none of it may reach a client.
_DATABASE_WORDS = (
    "sqlalchemy",
    "psycopg",
    "sqlite",
    "INSERT",
    "SELECT",
    "[SQL",
    "character varying",
)


@dataclass
class World:
    cluster: Cluster
    db_url: str
    alice: api_pb2_grpc.ApiStub
    alice_token: str
    mallory: api_pb2_grpc.ApiStub
    victim_id: int
    before: dict[str, Any]
    channels: list[grpc.Channel]


def _nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = {"k": value}
    return value


def _victim_view(world: World) -> dict[str, Any]:
    """What alice sees of her experiment: describe over gRPC (and it is listed)."""
    listed = world.alice.ListExperiments(api_pb2.ListExperimentsRequest(limit=1000), timeout=30)
    assert world.victim_id in [e.id for e in listed.experiments]
    got = world.alice.GetExperiment(api_pb2.GetExperimentRequest(id=world.victim_id), timeout=30)
    experiment = MessageToDict(got.experiment)
    trials = [MessageToDict(t) for t in got.trials]
    for trial in trials:
        trial.pop("waiting", None)  # the scheduler's current word, not stored data
    return {"experiment": experiment, "trials": trials}


def _http_list(world: World) -> tuple[int, Any]:
    url = f"http://127.0.0.1:{world.cluster.http_port}/api/v1/experiments?limit=1000"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {world.alice_token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read().decode(errors="replace")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp(f"hostile-{request.param}")
    given = None
    if request.param == "postgresql":
        given = request.getfixturevalue("postgres_url")
        _empty_postgres(given)
    cluster = start_cluster(tmp, given, agents=0, slots=1)
    db_url = given or f"sqlite:///{cluster.state_dir / 'assay.db'}"
    channels: list[grpc.Channel] = []
    try:
        admin, channel = authed_api(cluster.address)
        channels.append(channel)
        for user in ("alice", "mallory"):
            admin.CreateUser(
                api_pb2.CreateUserRequest(username=user, password=f"{user}-password-1"), timeout=30
            )
        alice_token = login(cluster.address, "alice", "alice-password-1")
        alice, channel = authed_api(cluster.address, alice_token)
        channels.append(channel)
        mallory, channel = authed_api(
            cluster.address, login(cluster.address, "mallory", "mallory-password-1")
        )
        channels.append(channel)
        victim = alice.CreateExperiment(
            api_pb2.CreateExperimentRequest(
                config_yaml=experiment_yaml(
                    name="alice's run",
                    description="tuned by hand",
                    labels=["baseline"],
                    data={"path": "/data/alice", "splits": [0.8, 0.2]},
                ),
                model_definition=model_archive(),
                activate=False,
            ),
            timeout=30,
        ).experiment
        world = World(cluster, db_url, alice, alice_token, mallory, victim.id, {}, channels)
        world.before = _victim_view(world)
        yield world
    finally:
        for channel in channels:
            channel.close()
        stop_cluster(cluster)


@pytest.fixture(autouse=True)
def _master_up(world: World) -> None:
    """A master an earlier test brought down is started again, so each test stands alone."""
    master = world.cluster.procs[0]
    if master.poll() is None:
        try:
            world.alice.WhoAmI(api_pb2.WhoAmIRequest(), timeout=5)
            return
        except grpc.RpcError:
            master.wait(timeout=30)  # on its way out
    world.cluster.restart_master()
    _wait_until_serving(world)


def _wait_until_serving(world: World) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            world.alice.WhoAmI(api_pb2.WhoAmIRequest(), timeout=5)
            return
        except grpc.RpcError:
            time.sleep(0.3)
    raise AssertionError(f"the master did not come back:\n{world.cluster.dump_logs()}")


def _submit(world: World, config: dict[str, Any] | str) -> grpc.RpcError | None:
    """Mallory submits `config` (a mapping, or YAML text as written); the error, if refused."""
    text = config if isinstance(config, str) else yaml.safe_dump(config)
    try:
        world.mallory.CreateExperiment(
            api_pb2.CreateExperimentRequest(
                config_yaml=text, model_definition=model_archive(), activate=False
            ),
            timeout=60,
        )
    except grpc.RpcError as e:
        return e
    return None


def _config(**overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(experiment_yaml(name="mallory's"))
    config.update(overrides)
    return config


def _assert_refused(world: World, error: grpc.RpcError | None, *words: str) -> None:
    assert error is not None, "the hostile config was accepted"
    details = error.details() or ""
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (error.code(), details)
    for word in words:
        assert word in details, details
    for word in _DATABASE_WORDS:
        assert word not in details, details
    _assert_victim_unharmed(world)


def _assert_victim_unharmed(world: World) -> None:
    assert world.cluster.procs[0].poll() is None, f"the master exited:\n{world.cluster.dump_logs()}"
    assert _victim_view(world) == world.before
    status, body = _http_list(world)
    assert status == 200, body
    assert world.victim_id in [int(e["id"]) for e in body["experiments"]]


def test_data_nested_990_deep_is_refused(world: World) -> None:
    text = experiment_yaml(name="mallory's") + "data: " + "{k: " * 990 + "1" + "}" * 990 + "\n"
    error = _submit(world, text)
    _assert_refused(world, error, "data.k.k", "32")


def test_hyperparameters_nested_50_deep_are_refused(world: World) -> None:
    hparams = {"global_batch_size": 8, "deep": _nested(50)}
    error = _submit(world, _config(hyperparameters=hparams))
    _assert_refused(world, error, "hyperparameters.deep.k", "32")


def test_the_deepest_accepted_config_is_listed_and_described(world: World) -> None:
    """A config at the depth limit passes, and every client can read it back."""
    hparams = {"global_batch_size": 8, "deep": _nested(29)}  # 32 levels, the config counted
    mallory = world.mallory.CreateExperiment(
        api_pb2.CreateExperimentRequest(
            config_yaml=yaml.safe_dump(_config(hyperparameters=hparams)),
            model_definition=model_archive(),
            activate=False,
        ),
        timeout=60,
    ).experiment
    got = world.alice.GetExperiment(api_pb2.GetExperimentRequest(id=mallory.id), timeout=30)
    assert MessageToDict(got.experiment.config)["hyperparameters"]["deep"] == _nested(29)
    _assert_victim_unharmed(world)


@pytest.mark.parametrize(
    ("where", "words"),
    [
        ('name: "a\\0b"', ("name:", "NUL")),
        ('description: "x\\0"', ("description:", "NUL")),
        ('labels: ["ok", "\\0"]', ("labels[1]:", "NUL")),
        ('data: {path: "\\0"}', ("data.path:", "NUL")),
        ('data: {"\\0": 1}', ("data:", "NUL")),
    ],
)
def test_a_nul_character_is_refused(world: World, where: str, words: tuple[str, ...]) -> None:
    """PostgreSQL cannot store a NUL: it made the commit fail and the master exit."""
    text = experiment_yaml(name="mallory's") + where + "\n"
    _assert_refused(world, _submit(world, text), *words)


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("name", "x" * 400_000, ("name:", "400000 characters", "at most 255")),
        ("name", "x" * 256, ("name:", "at most 255")),
        ("description", "y" * 300_000, ("description:", "at most 4096")),
        ("labels", ["z" * 256], ("labels[0]:", "at most 255")),
        ("labels", [f"l{i}" for i in range(65)], ("labels:", "65 labels", "at most 64")),
        ("name", "\x1b[2J\x1b[31mowned", ("name:", "control character")),
        ("description", "a\x07b", ("description:", "control character")),
        ("labels", ["tab\there"], ("labels[0]:", "control character")),
    ],
)
def test_names_descriptions_and_labels_are_bounded(
    world: World, field: str, value: Any, words: tuple[str, ...]
) -> None:
    _assert_refused(world, _submit(world, _config(**{field: value})), *words)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("data: {x: .nan}", ("data.x:", "finite")),
        ("data: {x: -.inf}", ("data.x:", "finite")),
        ("data: {when: 2001-12-14}", ("data.when:", "date", "quote")),
        ("data: {blob: !!binary aGVsbG8=}", ("data.blob:", "binary")),
        ("data: {s: !!set {a}}", ("data.s:", "set")),
        ("data: {2001-12-14: x}", ("data:", "key")),
        ("data: {big: " + "9" * 400 + "}", ("data.big:", "integer")),
    ],
)
def test_values_the_store_or_the_answer_cannot_hold_are_refused(
    world: World, text: str, words: tuple[str, ...]
) -> None:
    """Each of these failed in the commit thread (the master exited) or in the answer."""
    full = experiment_yaml(name="mallory's") + text + "\n"
    _assert_refused(world, _submit(world, full), *words)


def test_a_log_range_that_overflows_is_refused(world: World) -> None:
    """Its samples would be infinite: the searcher fails, or the trial row cannot be stored."""
    hparams = {
        "global_batch_size": 8,
        "lr": {"type": "log", "minval": 300, "maxval": 400, "base": 10},
    }
    config = _config(
        hyperparameters=hparams,
        searcher={
            "name": "random",
            "metric": "loss",
            "max_trials": 2,
            "max_length": {"batches": 10},
        },
    )
    _assert_refused(world, _submit(world, config), "hyperparameters.lr", "overflows")


def test_rows_stored_before_these_checks_do_not_break_lists(world: World) -> None:
    """Rows an older master accepted (hyperparameters 50 deep, a number the answer cannot
    hold) are shown as far as they can be; the list and describe answer for everyone."""
    store = Store.open(world.db_url, migrate_schema=False)
    try:
        experiment_id = store.reserve_id("experiments")
        trial_id = store.reserve_id("trials")
        deep = _nested(50)
        config = _config(hyperparameters={"global_batch_size": 8, "deep": deep})
        config["data"] = {"big": 10**400}
        if world.db_url.startswith("sqlite"):
            config["data"]["nan"] = float("nan")  # SQLite's JSON keeps it; JSON answers cannot
        now = dt.datetime.now(dt.UTC)
        batch = WriteBatch()
        batch.add_experiment(
            experiment_id,
            name="stored long ago",
            owner_id=store.user_id("mallory"),
            config=config,
            model_definition=model_archive(),
            state="COMPLETED",
            description="",
            labels=(),
            priority=42,
            now=now,
        )
        batch.add_trial(
            trial_id,
            experiment_id=experiment_id,
            request_id="r1",
            hparams={"global_batch_size": 8, "deep": deep},
            seed=1,
            state="COMPLETED",
            now=now,
        )
        store.apply(batch)
    finally:
        store.close()
    listed = world.alice.ListExperiments(api_pb2.ListExperimentsRequest(limit=1000), timeout=30)
    assert experiment_id in [e.id for e in listed.experiments]
    got = world.alice.GetExperiment(api_pb2.GetExperimentRequest(id=experiment_id), timeout=30)
    assert got.experiment.name == "stored long ago"
    shown = MessageToDict(got.experiment.config)
    assert shown["data"]["big"] == str(10**400)  # as text: a double cannot hold it
    cut = shown["hyperparameters"]["deep"]
    for _ in range(29):  # 32 levels are shown, the config counted
        cut = cut["k"]
    assert cut == {"k": "<nested too deep to show>"}
    assert got.trials[0].id == trial_id
    _assert_victim_unharmed(world)
    status, body = _http_list(world)
    assert status == 200, body
    assert experiment_id in [int(e["id"]) for e in body["experiments"]]


def test_a_refusal_of_a_huge_config_is_short_enough_to_send(world: World) -> None:
    """Messages quote what they refuse; a status's trailer holds a few KiB."""
    config = _config(labels=list(range(100_000)), data={f"k{i}": float("nan") for i in range(5000)})
    error = _submit(world, config)
    _assert_refused(world, error, "data.k0:", "more; fix these")
    assert error is not None
    assert len(error.details() or "") <= 4000
