"""Records -> messages: timestamps as protobuf's own conversion gives them, and a
submission's config built once per parsed config, masked as every other answer."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from google.protobuf.json_format import MessageToDict
from google.protobuf.timestamp_pb2 import Timestamp

from assay.common.archive import pack_model_dir
from assay.master.submission import PreparedExperiment, check_submission, new_record
from assay.master.wire import experiment, timestamp

_ZONES = [
    dt.UTC,
    dt.timezone(dt.timedelta(hours=5, minutes=30)),
    dt.timezone(-dt.timedelta(hours=8)),
]


@pytest.mark.parametrize(
    "value",
    [
        dt.datetime(1970, 1, 1),
        dt.datetime(1969, 12, 31, 23, 59, 59, 999_999),
        dt.datetime(1901, 2, 3, 4, 5, 6, 7),
        dt.datetime(2026, 12, 2, 0, 22, 48, 123_456),
        dt.datetime(2099, 12, 31, 23, 59, 59, 1),
    ],
)
def test_a_timestamp_is_what_from_datetime_gives(value: dt.datetime) -> None:
    for given in (value, *(value.replace(tzinfo=zone) for zone in _ZONES)):
        expected = Timestamp()
        expected.FromDatetime(given if given.tzinfo else given.replace(tzinfo=dt.UTC))
        assert timestamp(given) == expected, given


def test_no_time_is_no_timestamp() -> None:
    assert timestamp(None) is None


_CONFIG = """\
name: remembered
entrypoint: model_def:T
hyperparameters:
  global_batch_size: 8
  lr: 0.1
  db_password: hunter2
searcher: {name: single, metric: loss, max_length: {batches: 4}}
"""


def test_a_submissions_config_is_the_same_answer_built_once(tmp_path: Path) -> None:
    (tmp_path / "model_def.py").write_text("T = None\n")
    archive = pack_model_dir(tmp_path)
    answers = []
    for experiment_id in (1, 2):
        config, searcher = check_submission(_CONFIG, archive)  # the same parsed config
        prepared = PreparedExperiment(config, archive, "alice", 1, searcher, _CONFIG)
        now = dt.datetime.now(dt.UTC)
        record = new_record(prepared, experiment_id, "ACTIVE", now, 0.0)
        built = experiment(record, num_trials=1, parsed=config)
        assert built == experiment(record, num_trials=1)
        answers.append(built)
    hparams = MessageToDict(answers[0].config)["hyperparameters"]
    assert hparams["db_password"] != "hunter2"
    assert hparams["lr"] == 0.1
    # Each answer holds its own copy: changing one changes no other.
    answers[0].config["name"] = "changed"
    assert answers[1].config["name"] == "remembered"
