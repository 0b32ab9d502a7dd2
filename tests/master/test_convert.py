"""Records -> messages: timestamps as protobuf's own conversion gives them."""

from __future__ import annotations

import datetime as dt

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from assay.master._convert import timestamp

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
