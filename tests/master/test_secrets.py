"""Secrets in configs, passwords and task logs never reach API responses or logs.

The unit tests pin the rule (`_secrets`); the canary test plants unique values in an
experiment's config, in a user's password and in a trial's output, reads everything a
user can read over gRPC and HTTP, and looks for the canaries in every reply and every
log record, while the store and the agent still get the real values.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from assay.master.api import PREFIX, ROUTES
from assay.master.auth import MASK, is_secret_name, mask_secrets, mask_text, masked
from assay.master.store._engine import make_engine
from assay.proto import agent_pb2, api_pb2, common_pb2
from tests.credentials import login
from tests.http.conftest import Site, open_site, wait_for
from tests.master.conftest import ScriptedAgent, experiment_yaml, model_archive

# --- the rule -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "secret_key",
        "access_key",
        "session_token",
        "password",
        "new_password",
        "db_passwd",
        "client_secret",
        "credentials",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_ACCESS_KEY_ID",
        "apiKey",
        "api-key",
        "HF_TOKEN",
        "AUTHTOKEN",
        "APIKEY",
        "key",
    ],
)
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "tokenizer",
        "max_tokens",
        "pad_token_id",
        "key_dim",
        "num_key_value_heads",
        "keys",
        "monkey",
        "bucket",
        "endpoint_url",
        "global_batch_size",
        "lr",
    ],
)
def test_names_that_are_not_secret(name: str) -> None:
    assert not is_secret_name(name)


def test_masked_hides_secret_values_anywhere_and_keeps_the_rest() -> None:
    config = {
        "checkpoint_storage": {
            "type": "s3",
            "bucket": "b",
            "access_key": "AKIA",
            "secret_key": "s3cr3t",
            "save_trial_best": 2,
        },
        "hyperparameters": {"lr": 0.1, "api_key": {"type": "const", "val": "k"}},
        "data": {
            "env": ["HF_TOKEN=abc", "PATH=/usr/bin", "x=1"],
            "nested": [{"password": 1234}],
            "hf_token": None,
            "secret": "",
            "use_token": True,
        },
    }

    shown = masked(config)

    assert shown == {
        "checkpoint_storage": {
            "type": "s3",
            "bucket": "b",
            "access_key": MASK,
            "secret_key": MASK,
            "save_trial_best": 2,
        },
        "hyperparameters": {"lr": 0.1, "api_key": MASK},
        "data": {
            "env": [f"HF_TOKEN={MASK}", "PATH=/usr/bin", "x=1"],
            "nested": [{"password": MASK}],
            "hf_token": None,  # nothing given: worth seeing, reveals nothing
            "secret": "",
            "use_token": True,
        },
    }
    assert config["checkpoint_storage"]["secret_key"] == "s3cr3t"  # a copy


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ('{"secret_key": "abc", "bucket": "b"}', '{"secret_key": "***", "bucket": "b"}'),
        ("{'access_key': 'AK IA'}", "{'access_key': '***'}"),
        ("checkpoint_storage:\n  secret_key: ab#c d\n  bucket: b", None),
        ("  - access_key: AKIA", "  - access_key: ***"),
        ("AWS_SECRET_ACCESS_KEY=abc other", "AWS_SECRET_ACCESS_KEY=*** other"),
        ("hf_token = 'abc'", "hf_token = '***'"),
        ("tokenizer: gpt2\nmax_tokens: 512", "tokenizer: gpt2\nmax_tokens: 512"),
        ("key_dim=64 lr=0.1", "key_dim=64 lr=0.1"),
        ("the key: value of it", "the key: value of it"),
        ("assay: run 2 failed (exit codes [1])", "assay: run 2 failed (exit codes [1])"),
    ],
)
def test_mask_secrets_covers_config_keys(text: str, shown: str | None) -> None:
    if shown is None:
        shown = "checkpoint_storage:\n  secret_key: ***\n  bucket: b"
    assert mask_secrets(text) == shown
    assert mask_text(text) == shown.replace("***", MASK)


def test_store_errors_carry_no_values() -> None:
    """A failed write is logged and reported: the row it wrote (a config) stays out."""
    engine = make_engine("sqlite://")
    with engine.connect() as connection:
        connection.execute(text("CREATE TABLE t (a TEXT UNIQUE)"))
        connection.execute(text("INSERT INTO t VALUES (:a)"), {"a": "CANARY-row"})
        with pytest.raises(SQLAlchemyError) as caught:
            connection.execute(text("INSERT INTO t VALUES (:a)"), {"a": "CANARY-row"})
    assert "CANARY-row" not in str(caught.value)


# --- the canary ---------------------------------------------------------------------------

_RUN = uuid.uuid4().hex[:12]
SECRET_KEY = f"CANARY-secret-{_RUN}"
ACCESS_KEY = f"CANARY-access-{_RUN}"
DATA_TOKEN = f"CANARY-token-{_RUN}"
HPARAM_KEY = f"CANARY-hparam-{_RUN}"
ENV_KEY = f"CANARY-env-{_RUN}"
PASSWORD = f"CANARY-password-{_RUN}"
OUTPUT = f"CANARY-output-{_RUN}"
CANARY = re.compile(rf"CANARY-\w+-{_RUN}")


def _secret_config(**overrides: Any) -> dict[str, Any]:
    """An experiment config with a canary in every place a secret may be written."""
    config: dict[str, Any] = {
        "hyperparameters": {"global_batch_size": 8, "lr": 0.1, "api_key": HPARAM_KEY},
        "checkpoint_storage": {
            "type": "s3",
            "bucket": "canary-bucket",
            "endpoint_url": "http://127.0.0.1:9",  # nothing is ever stored there
            "access_key": ACCESS_KEY,
            "secret_key": SECRET_KEY,
        },
        "data": {"hf_token": DATA_TOKEN, "env": [f"WANDB_API_KEY={ENV_KEY}"]},
        "max_restarts": 0,
    }
    config.update(overrides)
    return config


class Seen:
    """Every reply body read in the test, for the canary search at the end."""

    def __init__(self) -> None:
        self.bodies: list[tuple[str, str]] = []

    def add(self, what: str, body: object) -> None:
        if isinstance(body, bytes):
            body = body.decode("utf-8", "replace")
        self.bodies.append((what, str(body)))

    def leaks(self) -> list[str]:
        return [
            f"{what}: {CANARY.findall(body)}" for what, body in self.bodies if CANARY.search(body)
        ]


@pytest.fixture
def canary_site(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> Iterator[Site]:
    caplog.set_level(logging.DEBUG, logger="assay")
    # The canary config's S3 endpoint is one the master allows.
    site = open_site(tmp_path / "master", s3_endpoints="http://127.0.0.1:9")
    yield site
    site.close()


def test_canaries_appear_in_no_reply_and_no_log(
    canary_site: Site, caplog: pytest.LogCaptureFixture
) -> None:
    site, seen = canary_site, Seen()
    store = site.master.store

    experiment_ids = [*_create_paused(site, seen), _run_and_fail(site)]
    _log_in_and_fail(site, seen)
    trial_ids = [t.id for eid in experiment_ids for t in store.list_trials(eid)]
    _read_over_grpc(site, seen, experiment_ids, trial_ids)
    _read_over_http(site, seen, experiment_ids, trial_ids)

    assert seen.leaks() == []
    records = [f"{r.name}: {r.getMessage()} {r.exc_text or ''}" for r in caplog.records]
    assert [line for line in [*records, caplog.text] if CANARY.search(line)] == []
    assert any("failed" in line for line in records)  # the master did log the failure
    # The store keeps the real values: the trials need them.
    for eid in experiment_ids:
        stored = store.get_experiment(eid).config
        assert stored["checkpoint_storage"]["secret_key"] == SECRET_KEY
        assert stored["data"]["hf_token"] == DATA_TOKEN


def _create_paused(site: Site, seen: Seen) -> list[int]:
    """Two paused experiments holding canaries, one made over gRPC, one over HTTP."""
    created = site.api.CreateExperiment(
        api_pb2.CreateExperimentRequest(
            config_yaml=experiment_yaml(**_secret_config(name="grpc")),
            model_definition=model_archive(),
            activate=False,
        )
    )
    seen.add("CreateExperiment", created)
    assert created.experiment.config["checkpoint_storage"]["secret_key"] == MASK
    body = {
        "config_yaml": experiment_yaml(**_secret_config(name="http")),
        "model_definition": base64.b64encode(model_archive()).decode(),
        "activate": False,
    }
    reply = site.post("/api/v1/experiments", json.dumps(body).encode())
    assert reply.status == 200, reply.body
    seen.add("POST /experiments", reply.body)
    return [created.experiment.id, reply.json()["experiment"]["id"]]


def _run_and_fail(site: Site) -> int:
    """An experiment whose trial runs on an agent, which gets the real config; the
    output it ships and the failure it reports hold canaries."""
    store = site.master.store
    agent = ScriptedAgent(site.master.port, "agent-1", slots=1)
    try:
        eid = site.create(**_secret_config(name="ran"))
        start = agent.next("start").start
        assert json.loads(start.config_json)["checkpoint_storage"]["secret_key"] == SECRET_KEY
        assert json.loads(start.hparams_json)["api_key"] == HPARAM_KEY
        lines = [
            common_pb2.LogLine(message=f"AWS_SECRET_ACCESS_KEY={OUTPUT}", stream="stdout"),
            common_pb2.LogLine(message=f'config: {{"secret_key": "{OUTPUT}"}}', stream="stderr"),
            common_pb2.LogLine(message="training", stream="stdout"),
        ]
        batch = agent_pb2.LogBatch(allocation_id=start.allocation_id, lines=lines)
        agent.send(agent_pb2.AgentMessage(logs=batch))
        agent.exited(start.allocation_id, [1], message=f"boto3 said secret_key={OUTPUT}")
        wait_for(lambda: store.get_experiment(eid).state == "ERROR")
    finally:
        agent.close()
    logs = [line.message for line in store.tail_logs(start.trial_id)]
    assert "AWS_SECRET_ACCESS_KEY=***" in logs
    assert "training" in logs
    return eid


def _log_in_and_fail(site: Site, seen: Seen) -> None:
    """A user with the canary password logs in; then logins fail with it, both ways."""
    request = api_pb2.CreateUserRequest(username="carol", password=PASSWORD)
    seen.add("CreateUser", site.api.CreateUser(request))
    carol = site.post(
        "/api/v1/login", json.dumps({"username": "carol", "password": PASSWORD}).encode()
    )
    assert carol.status == 200
    seen.add("login carol", carol.body)
    for user in ("admin", "nobody"):
        with pytest.raises(grpc.RpcError) as failed:
            login(f"127.0.0.1:{site.master.port}", user, PASSWORD)
        seen.add(f"gRPC Login {user}", failed.value.details())
    bodies = [
        {"username": "admin", "password": PASSWORD},
        {"username": "carol", "password": PASSWORD + "-wrong"},
        {"username": "admin", "password": PASSWORD, "extra": PASSWORD},
        {"username": "admin", "password": [PASSWORD]},
    ]
    for body in bodies:
        reply = site.post("/api/v1/login", json.dumps(body).encode(), auth=False)
        assert reply.status in (400, 401, 429)
        seen.add(f"HTTP login {body}", reply.body)
    change = {"old_password": PASSWORD + "-old", "new_password": PASSWORD + "-new"}
    reply = site.post("/api/v1/users/admin/password", json.dumps(change).encode())
    assert reply.status == 401
    seen.add("HTTP change password", reply.body)


def _read_over_grpc(
    site: Site, seen: Seen, experiment_ids: list[int], trial_ids: list[int]
) -> None:
    api = site.api
    for eid in experiment_ids:
        got = api.GetExperiment(api_pb2.GetExperimentRequest(id=eid))
        assert got.experiment.config["checkpoint_storage"]["access_key"] == MASK
        seen.add(f"GetExperiment {eid}", got)
        # What `assay experiment describe --json` prints.
        shown = json.loads(json_format.MessageToJson(got))["experiment"]["config"]
        assert shown["data"] == {"hf_token": MASK, "env": [f"WANDB_API_KEY={MASK}"]}
    listed = api.ListExperiments(api_pb2.ListExperimentsRequest())
    assert len(listed.experiments) == len(experiment_ids)
    seen.add("ListExperiments", listed)
    for tid in trial_ids:
        seen.add(f"GetTrial {tid}", api.GetTrial(api_pb2.GetTrialRequest(id=tid)))
        stream = api.StreamTrialLogs(api_pb2.StreamTrialLogsRequest(trial_id=tid))
        seen.add(f"StreamTrialLogs {tid}", list(stream))
    seen.add("GetQueue", api.GetQueue(api_pb2.GetQueueRequest()))


def _read_over_http(
    site: Site, seen: Seen, experiment_ids: list[int], trial_ids: list[int]
) -> None:
    """Every GET route of the HTTP API, with every id there is."""
    ids = {
        "experiments": [str(i) for i in experiment_ids],
        "trials": [str(i) for i in trial_ids],
        "checkpoints": ["00000000-0000-0000-0000-000000000000"],  # none was made
        "workspaces": ["Default"],  # and its project, for /workspaces/{workspace}/projects/{name}
        "models": ["kept"],  # made here, with no version
        "resource-pools": ["default"],
    }
    seen.add("CreateModel", site.api.CreateModel(api_pb2.CreateModelRequest(name="kept")))
    queries = {
        "GetExperimentMetrics": "?name=loss",
        "ListCheckpoints": f"?experiment_id={experiment_ids[-1]}",
    }
    gets = [r for r in ROUTES if r.method == "GET"]
    assert {"GetExperiment", "ListExperiments", "GetTrial", "StreamTrialLogs"} <= {
        r.rpc for r in gets
    }
    for route in gets:
        filled = [route.path]
        if route.path_fields:
            collection = route.path.split("/")[1]
            placeholder = "{" + route.path_fields[0] + "}"
            filled = [
                route.path.replace(placeholder, v)
                .replace("{name}", "Uncategorized")
                .replace("{version}", "0")
                for v in ids[collection]
            ]
        for path in filled:
            reply = site.get(PREFIX + path + queries.get(route.rpc, ""))
            # No checkpoint was made, and the model has no version.
            expected = 404 if route.rpc in ("GetCheckpoint", "GetModelVersion") else 200
            assert reply.status == expected, (path, reply.body)
            seen.add(f"GET {path}", reply.body)
    for path in ("/api/v1/openapi.json", "/api/v1/health", "/"):
        seen.add(f"GET {path}", site.get(path).body)


def test_the_submitted_text_keeps_order_and_comments_with_its_secrets_masked() -> None:
    import yaml

    from assay.master.auth import masked_config_text

    text = (
        "# digits, tuned\n"
        "name: tuned\n"
        "data:\n"
        "  hf_token: hf_abcdef  # from the vault\n"
        "  url: https://example.com\n"
        "checkpoint_storage: {type: shared_fs, host_path: /tmp}\n"
    )
    shown = masked_config_text(text, yaml.safe_load(text))
    assert shown is not None
    assert shown.startswith("# digits, tuned\nname: tuned\n")
    assert f'  hf_token: "{MASK}"' in shown
    assert "hf_abcdef" not in shown
    assert "https://example.com" in shown


@pytest.mark.parametrize(
    "text",
    [
        "name: x\ndata:\n  secret_key: |\n    abcdef\n",  # a block scalar
        "name: x\ndata: {secret_key: abcdef}\n",  # a flow mapping
        'name: x\ndata: {"secret_key": abcdef}\n',
        "name: x\ndata:\n  ? secret_key\n  : abcdef\n",  # an explicit key
    ],
)
def test_a_text_whose_masking_is_not_complete_is_not_shown(text: str) -> None:
    import yaml

    from assay.master.auth import masked_config_text

    assert masked_config_text(text, yaml.safe_load(text)) is None
