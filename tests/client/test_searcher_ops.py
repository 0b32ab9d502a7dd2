"""What a custom searcher's operations become on the wire."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from assay.client.searcher import Create, _to_proto


def test_numpy_and_torch_scalars_in_a_create_are_sent_as_numbers() -> None:
    """A sampler built on numpy hands back numpy.int64 and float64; json refused them
    with a bare TypeError inside the runner."""
    op = Create(
        hparams={"n": np.int64(3), "lr": np.float64(0.5), "w": torch.tensor(2.5), "v": [1, 2]},
        request_id="t1",
    )
    sent = json.loads(_to_proto(op).create.hparams_json)
    assert sent == {"n": 3, "lr": 0.5, "w": 2.5, "v": [1, 2]}
    assert isinstance(sent["n"], int)


def test_a_hyperparameter_json_cannot_hold_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match=r"a hyperparameter of type object .* cannot be sent"):
        _to_proto(Create(hparams={"x": object()}, request_id="t2"))
