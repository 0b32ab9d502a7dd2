"""DCP's `.metadata` as each Python writes it, through the sharded checkpoint's unpickler.

Python 3.11.0 to 3.11.4 (Debian 12's 3.11.2 among them) pickle an enum member as
`getattr(EnumClass, "NAME")`, later releases by value. The streams here are built the
way those releases write them, whatever Python runs the test, so a checkpoint written on
either loads on any; and the `getattr` the unpickler offers reaches enum members of the
classes it already allows, and nothing else.
"""

from __future__ import annotations

import enum
import hashlib
import io
import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING, TensorProperties

from assay._checkpoint import CheckpointError
from assay.strategy._sharded import (
    DCP_METADATA,
    SHARD_MANIFEST,
    _enum_member,
    _MetadataUnpickler,
    load_sharded,
    save_sharded,
)

_DCP = "torch.distributed.checkpoint.metadata"


class _PicklerOf3112(pickle.Pickler):
    """Writes enum members as Python 3.11.0-3.11.4's `Enum.__reduce_ex__` does."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, enum.Enum):
            return getattr, (type(obj), obj._name_)
        return NotImplemented


def _dumps_as_3112(value: Any) -> bytes:
    out = io.BytesIO()
    _PicklerOf3112(out).dump(value)
    return out.getvalue()


def _getattr_stream(module: str, name: str, attribute: str) -> bytes:
    """`getattr(module.name, attribute)` in protocol 2 opcodes: GLOBAL builtins getattr,
    GLOBAL the class, the attribute's name, TUPLE2, REDUCE."""
    return (
        b"\x80\x02cbuiltins\ngetattr\n"
        + f"c{module}\n{name}\n".encode()
        + b"X"
        + len(attribute.encode()).to_bytes(4, "little")
        + attribute.encode()
        + b"\x86R."
    )


def _load(data: bytes) -> Any:
    return _MetadataUnpickler(io.BytesIO(data)).load()


def test_an_enum_member_pickled_by_name_through_getattr_loads() -> None:
    stream = _getattr_stream(_DCP, "_MEM_FORMAT_ENCODING", "TORCH_CONTIGUOUS_FORMAT")
    assert _load(stream) is _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT


def test_tensor_properties_written_as_3112_writes_them_load_equal() -> None:
    properties = TensorProperties(dtype=torch.float16, memory_format=torch.channels_last)
    data = _dumps_as_3112(properties)
    assert b"getattr" in data
    assert _load(data) == properties


def test_a_sharded_checkpoint_whose_metadata_3112_wrote_is_restored(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    save_sharded(tmp_path, model, None, rank=0, world_size=1, strategy="single")
    metadata = _load((tmp_path / DCP_METADATA).read_bytes())
    rewritten = _dumps_as_3112(metadata)
    assert b"getattr" in rewritten
    (tmp_path / DCP_METADATA).write_bytes(rewritten)
    manifest = json.loads((tmp_path / SHARD_MANIFEST).read_text())
    manifest["files"][DCP_METADATA] = {
        "size": len(rewritten),
        "sha256": hashlib.sha256(rewritten).hexdigest(),
    }
    (tmp_path / SHARD_MANIFEST).write_text(json.dumps(manifest))

    torch.manual_seed(1)
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    load_sharded(tmp_path, fresh, None)
    for name, tensor in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name


@pytest.mark.parametrize(
    ("module", "name", "attribute"),
    [
        ("torch", "Size", "__reduce__"),  # an allowed class that is not an enum
        ("collections", "OrderedDict", "fromkeys"),
        ("torch", "float32", "to_real"),  # an allowed object that is not a class
    ],
)
def test_getattr_of_anything_but_an_enum_class_is_refused(
    module: str, name: str, attribute: str
) -> None:
    with pytest.raises(pickle.UnpicklingError, match="not an enum class"):
        _load(_getattr_stream(module, name, attribute))


@pytest.mark.parametrize(
    "attribute", ["__class__", "_member_map_", "__members__", "mro", "_missing_", "nope"]
)
def test_getattr_of_an_allowed_enum_that_is_not_a_member_is_refused(attribute: str) -> None:
    with pytest.raises(pickle.UnpicklingError, match="not one of its members"):
        _load(_getattr_stream(_DCP, "_MEM_FORMAT_ENCODING", attribute))


def test_getattr_of_a_member_of_an_enum_class_not_allowed_is_refused() -> None:
    with pytest.raises(pickle.UnpicklingError, match="refers to signal.Signals"):
        _load(_getattr_stream("signal", "Signals", "SIGKILL"))
    # A class that reached the stream by another way is checked again by the getattr.
    with pytest.raises(pickle.UnpicklingError, match="not an enum class"):
        _enum_member(CheckpointError, "args")

    class Colour(enum.Enum):
        RED = 1

    with pytest.raises(pickle.UnpicklingError, match="not an enum class"):
        _enum_member(Colour, "RED")
    with pytest.raises(pickle.UnpicklingError, match="not one of its members"):
        _enum_member(_MEM_FORMAT_ENCODING, 0)


def test_other_builtins_stay_refused() -> None:
    for name in ("eval", "exec", "setattr", "__import__"):
        stream = b"\x80\x02cbuiltins\n" + name.encode() + b"\n."
        with pytest.raises(pickle.UnpicklingError, match=f"refers to builtins.{name}"):
            _load(stream)
