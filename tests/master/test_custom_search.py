"""A custom search's two RPCs on a real master (no agents: its trials wait in the queue):
the runner reads the queued events, a bad batch is refused whole with the reason, a good
one creates trials, and a batch that answers events already answered is refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from assay.proto import api_pb2
from tests.http.conftest import Site, open_site

SEARCHER = {"name": "custom", "metric": "loss", "max_trials": 3}
HPARAMS = {"global_batch_size": 8, "lr": {"type": "double", "minval": 0.01, "maxval": 0.1}}


@pytest.fixture
def custom_site(tmp_path: Path) -> Iterator[Site]:
    opened = open_site(tmp_path / "master")
    yield opened
    opened.close()


def _create(request_id: str, lr: float) -> list[api_pb2.SearcherOperation]:
    return [
        api_pb2.SearcherOperation(
            create=api_pb2.CreateTrialOperation(
                request_id=request_id, hparams_json=json.dumps({"lr": lr})
            )
        ),
        api_pb2.SearcherOperation(
            validate_after=api_pb2.ValidateAfterOperation(request_id=request_id, length=4)
        ),
    ]


def _post(site: Site, eid: int, after: int, ops: list[api_pb2.SearcherOperation]) -> int:
    request = api_pb2.PostSearcherOperationsRequest(
        experiment_id=eid,
        triggered_by_event_id=after,
        operations=ops,
        method_state=b"state-after-%d" % after,
        progress=0.5,
    )
    return int(site.api.PostSearcherOperations(request).acknowledged_event_id)


def _refused(site: Site, eid: int, after: int, ops: list[api_pb2.SearcherOperation]) -> str:
    with pytest.raises(grpc.RpcError) as refused:
        _post(site, eid, after, ops)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return str(refused.value.details())


def test_a_runner_reads_events_and_its_batches_are_checked(custom_site: Site) -> None:
    site = custom_site
    eid = site.create(searcher=SEARCHER, hyperparameters=HPARAMS)
    events = site.api.GetSearcherEvents(api_pb2.GetSearcherEventsRequest(experiment_id=eid))
    assert [(e.id, e.kind) for e in events.events] == [(1, "initial_operations")]
    assert (events.acknowledged_event_id, events.experiment_state) == (0, "ACTIVE")
    assert site.master.store.list_trials(eid) == []  # the experiment waits for its runner

    assert "hyperparameter lr: expected a number from 0.01 to 0.1, got 0.5" in _refused(
        site, eid, 1, _create("a", 0.05) + _create("b", 0.5)
    )
    assert "unknown trial 'zz'" in _refused(
        site,
        eid,
        1,
        [api_pb2.SearcherOperation(close=api_pb2.CloseTrialOperation(request_id="zz"))],
    )
    assert site.master.store.list_trials(eid) == []  # refused whole

    assert _post(site, eid, 1, _create("a", 0.05) + _create("b", 0.02)) == 1
    trials = site.master.store.list_trials(eid)
    assert sorted((t.request_id, t.hparams["lr"]) for t in trials) == [("a", 0.05), ("b", 0.02)]
    events = site.api.GetSearcherEvents(
        api_pb2.GetSearcherEventsRequest(experiment_id=eid, after_event_id=1)
    )
    assert [(e.kind, e.request_id) for e in events.events] == [
        ("trial_created", "a"),
        ("trial_created", "b"),
    ]
    assert events.method_state == b"state-after-1"
    assert "event 1 was already answered" in _refused(site, eid, 1, [])
    assert "max_trials is 3" in _refused(site, eid, 3, _create("c", 0.05) + _create("d", 0.05))
    got = site.api.GetExperiment(api_pb2.GetExperimentRequest(id=eid)).experiment
    assert got.progress == pytest.approx(0.5)

    cancel = api_pb2.ExperimentActionRequest(id=eid, action=api_pb2.EXPERIMENT_ACTION_CANCEL)
    site.api.ExperimentAction(cancel)
    with pytest.raises(grpc.RpcError) as refused:
        _post(site, eid, 3, [])
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "its search takes no more operations" in str(refused.value.details())
    events = site.api.GetSearcherEvents(
        api_pb2.GetSearcherEventsRequest(experiment_id=eid, after_event_id=1)
    )
    assert (events.experiment_state, events.acknowledged_event_id) == ("CANCELED", 1)


def test_another_searcher_takes_no_operations(custom_site: Site) -> None:
    eid = custom_site.create()
    with pytest.raises(grpc.RpcError) as refused:
        custom_site.api.GetSearcherEvents(api_pb2.GetSearcherEventsRequest(experiment_id=eid))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "does not use the custom searcher" in str(refused.value.details())
