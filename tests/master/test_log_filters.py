"""StreamTrialLogs's filters on a real master (`assay trial logs --rank/--level/--since/
--grep/--head`): applied by the master before head and tail count, also while following,
and a bad filter refused with what to write."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from assay.master._server import MasterServer
from assay.proto import agent_pb2, api_pb2, api_pb2_grpc, common_pb2
from tests.master.conftest import ScriptedAgent, eventually, experiment_yaml, model_archive

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def _stamp(minutes: int) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(T0 + dt.timedelta(minutes=minutes))
    return stamp


@pytest.fixture
def running(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> Iterator[tuple[ScriptedAgent, str, int]]:
    """An agent running the one trial of a new experiment: (agent, allocation, trial id)."""
    agent = ScriptedAgent(master.port, "a1", slots=1)
    api.CreateExperiment(
        api_pb2.CreateExperimentRequest(
            config_yaml=experiment_yaml(), model_definition=model_archive(), activate=True
        )
    )
    start = agent.next("start").start
    try:
        yield agent, start.allocation_id, start.trial_id
    finally:
        agent.close()


def _ship(agent: ScriptedAgent, allocation: str, lines: list[common_pb2.LogLine]) -> None:
    agent.send(
        agent_pb2.AgentMessage(logs=agent_pb2.LogBatch(allocation_id=allocation, lines=lines))
    )


def _messages(api: api_pb2_grpc.ApiStub, trial_id: int, **request: Any) -> list[str]:
    lines = api.StreamTrialLogs(api_pb2.StreamTrialLogsRequest(trial_id=trial_id, **request))
    return [line.message for line in lines]


def test_the_master_filters_before_head_and_tail_count(
    api: api_pb2_grpc.ApiStub, running: tuple[ScriptedAgent, str, int]
) -> None:
    agent, allocation, trial_id = running
    _ship(
        agent,
        allocation,
        [
            common_pb2.LogLine(rank=r, level=level, message=f"{level or 'plain'} r{r} m{m}",
                               timestamp=_stamp(m))
            for m, (r, level) in enumerate(
                [(0, ""), (1, "DEBUG"), (0, "INFO"), (1, "WARNING"), (0, "ERROR"), (1, "ERROR")]
            )
        ],
    )  # fmt: skip
    eventually(lambda: len(_messages(api, trial_id)) == 6)

    assert _messages(api, trial_id, ranks=[1]) == ["DEBUG r1 m1", "WARNING r1 m3", "ERROR r1 m5"]
    assert _messages(api, trial_id, min_level="warning") == [
        "WARNING r1 m3",
        "ERROR r0 m4",
        "ERROR r1 m5",
    ]
    assert _messages(api, trial_id, min_level="INFO", head=2) == ["plain r0 m0", "INFO r0 m2"]
    assert _messages(api, trial_id, ranks=[0], tail=2) == ["INFO r0 m2", "ERROR r0 m4"]
    since = (T0 + dt.timedelta(minutes=4)).isoformat()
    assert _messages(api, trial_id, since=since) == ["ERROR r0 m4", "ERROR r1 m5"]
    assert _messages(api, trial_id, search_text="r1 m") == [
        "DEBUG r1 m1",
        "WARNING r1 m3",
        "ERROR r1 m5",
    ]
    assert _messages(api, trial_id, head=1) == ["plain r0 m0"]


def test_a_filtered_follow_gets_the_new_lines_it_matches(
    api: api_pb2_grpc.ApiStub, running: tuple[ScriptedAgent, str, int]
) -> None:
    agent, allocation, trial_id = running
    got: list[str] = []
    ended: list[grpc.StatusCode] = []
    follow = api.StreamTrialLogs(
        api_pb2.StreamTrialLogsRequest(trial_id=trial_id, follow=True, search_text="loss")
    )

    def read() -> None:
        try:
            for line in follow:
                got.append(line.message)
        except grpc.RpcError as e:  # the cancel below
            ended.append(e.code())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        for batch in range(3):
            lines = [common_pb2.LogLine(message=f"step {batch}.{i}") for i in range(50)]
            _ship(agent, allocation, [*lines, common_pb2.LogLine(message=f"loss {batch}")])
            wanted = [f"loss {batch}"]
            eventually(lambda: got[-1:] == wanted)  # noqa: B023 - used before the next turn
    finally:
        follow.cancel()
        reader.join(10)
    assert got == ["loss 0", "loss 1", "loss 2"]
    assert ended == [grpc.StatusCode.CANCELLED]


@pytest.mark.parametrize(
    ("request_fields", "said"),
    [
        ({"min_level": "LOUD"}, "min_level must be one of TRACE, DEBUG, INFO, WARNING, ERROR"),
        ({"since": "yesterday"}, "since must be an RFC 3339 time with its offset"),
        ({"since": "2026-03-01T12:00:00"}, "since must be an RFC 3339 time with its offset"),
        ({"since": "0001-01-01T00:00:00+05:00"}, "since must be an RFC 3339 time with its offset"),
        ({"head": 2, "tail": 2}, "head cannot be combined with tail or follow"),
        ({"head": 2, "follow": True}, "head cannot be combined with tail or follow"),
        ({"ranks": [-1]}, "ranks count from 0, got -1"),
        ({"search_text": "x" * 1001}, "search_text must be at most 1000 characters"),
    ],
)
def test_a_bad_filter_is_refused_with_what_to_write(
    api: api_pb2_grpc.ApiStub,
    running: tuple[ScriptedAgent, str, int],
    request_fields: dict[str, object],
    said: str,
) -> None:
    _, _, trial_id = running
    with pytest.raises(grpc.RpcError) as refused:
        _messages(api, trial_id, **request_fields)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert said in str(refused.value.details())
