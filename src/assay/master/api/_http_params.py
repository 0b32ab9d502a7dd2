"""HTTP path and query parameters -> the proto request message, by walking its fields.

A route of the HTTP API takes exactly the fields of its RPC's request message: each path
segment and query parameter is named after a field and parsed by that field's type, so
nothing here is written per message. Every refusal says which parameter and what it
accepts; anything that could reach the store as a value it rejects with an internal
error (a negative offset, an out-of-range integer, a NUL byte) is refused here.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message
from multidict import MultiMapping

_F = FieldDescriptor
_INT_MAX = {
    _F.TYPE_INT32: 2**31 - 1,
    _F.TYPE_SINT32: 2**31 - 1,
    _F.TYPE_SFIXED32: 2**31 - 1,
    _F.TYPE_UINT32: 2**32 - 1,
    _F.TYPE_FIXED32: 2**32 - 1,
    _F.TYPE_INT64: 2**63 - 1,
    _F.TYPE_SINT64: 2**63 - 1,
    _F.TYPE_SFIXED64: 2**63 - 1,
    _F.TYPE_UINT64: 2**64 - 1,
    _F.TYPE_FIXED64: 2**64 - 1,
}
_FLOATS = {_F.TYPE_DOUBLE, _F.TYPE_FLOAT}
_DIGITS = re.compile(r"[0-9]{1,20}")
_TRUE = {"true", "1"}
_FALSE = {"false", "0"}


class ParamError(ValueError):
    """A parameter the route cannot take; `str()` is the message for the client."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"parameter {name!r}: {problem}")
        self.name = name


def enum_prefix(enum: EnumDescriptor) -> str:
    """The prefix every value's name shares up to an underscore (EXPERIMENT_STATE_)."""
    names = [v.name for v in enum.values]
    prefix = names[0]
    for name in names[1:]:
        while not name.startswith(prefix):
            prefix = prefix[:-1]
    return prefix[: prefix.rfind("_") + 1]


def enum_of(field: FieldDescriptor) -> EnumDescriptor:
    enum = field.enum_type
    if enum is None:
        raise TypeError(f"{field.full_name} is not an enum")
    return enum


def enum_choices(enum: EnumDescriptor) -> list[str]:
    """The names a parameter of this enum takes: lower case, without the prefix; the
    zero value (UNSPECIFIED) is not one."""
    prefix = enum_prefix(enum)
    return [v.name.removeprefix(prefix).lower() for v in enum.values if v.number != 0]


def query_fields(descriptor: Descriptor, path: Iterable[str]) -> list[FieldDescriptor]:
    """The request's fields a query string may set: every one not in the path."""
    taken = set(path)
    fields = [f for f in descriptor.fields if f.name not in taken]
    for field in fields:
        if field.type in (_F.TYPE_MESSAGE, _F.TYPE_GROUP, _F.TYPE_BYTES):
            raise TypeError(f"{descriptor.full_name}.{field.name} cannot be a query parameter")
    return fields


def build_request(
    message_class: type[Message],
    path: Mapping[str, str],
    query: MultiMapping[str],
    taken: Iterable[str] = (),
) -> Message:
    """The request message that `path` and `query` describe, or `ParamError`. The
    fields in `taken` (the path's, and those the route sets) are not query parameters."""
    descriptor: Descriptor = message_class.DESCRIPTOR  # type: ignore[assignment]
    by_name: Mapping[str, FieldDescriptor] = descriptor.fields_by_name
    allowed = {f.name for f in query_fields(descriptor, {*path, *taken})}
    _refuse_unknown(query, allowed)
    message = message_class()
    for name, raw in path.items():
        _set(message, by_name[name], [raw])
    for name in dict.fromkeys(query):
        _set(message, by_name[name], query.getall(name))
    return message


def body_fields(descriptor: Descriptor, taken: Iterable[str]) -> list[FieldDescriptor]:
    """The request's fields a JSON body may set: every one the URL does not."""
    skip = set(taken)
    return [f for f in descriptor.fields if f.name not in skip]


def build_body_request(
    message_class: type[Message],
    path: Mapping[str, str],
    query: MultiMapping[str],
    body: bytes,
    taken: Iterable[str] = (),
) -> Message:
    """The request message of a route whose fields come from a JSON body (the message's
    JSON form, proto or lowerCamel field names) and the path; or `ParamError`."""
    descriptor: Descriptor = message_class.DESCRIPTOR  # type: ignore[assignment]
    _refuse_unknown(query, set())
    try:
        data = json.loads(body) if body.strip() else {}
    except (ValueError, RecursionError) as e:  # bad UTF-8 or JSON, nesting, huge numbers
        raise ParamError("body", f"must be a JSON object: {str(e)[:200]}") from None
    if not isinstance(data, dict):
        raise ParamError("body", f"must be a JSON object, got {type(data).__name__}")
    allowed = body_fields(descriptor, {*path, *taken})
    names = {f.name for f in allowed} | {f.json_name for f in allowed}
    for key in data:
        if key not in names:
            takes = ", ".join(sorted(f.name for f in allowed)) or "no fields"
            raise ParamError(str(key)[:60], f"unknown field of the body; it takes: {takes}")
    message = message_class()
    try:
        json_format.ParseDict(data, message)
    except (json_format.ParseError, ValueError, RecursionError) as e:
        raise ParamError("body", str(e)[:300]) from None
    by_name: Mapping[str, FieldDescriptor] = descriptor.fields_by_name
    for name, raw in path.items():
        _set(message, by_name[name], [raw])
    _refuse_nul(message, descriptor)
    return message


def _refuse_nul(message: Message, descriptor: Descriptor) -> None:
    for field in descriptor.fields:
        if field.type != _F.TYPE_STRING:
            continue
        value = getattr(message, field.name)
        values = list(value) if field.is_repeated else [value]
        if any("\x00" in v for v in values):
            raise ParamError(field.name, "must not contain a NUL character")


def _refuse_unknown(query: MultiMapping[str], allowed: set[str]) -> None:
    for key in query:
        if key not in allowed:
            takes = ", ".join(sorted(allowed)) or "no parameters"
            raise ParamError(key, f"unknown parameter; this route takes: {takes}")


def _set(message: Message, field: FieldDescriptor, raws: list[str]) -> None:
    if field.is_repeated:
        values = [_parse(field, raw) for raw in raws]
        getattr(message, field.name).extend(values)
        return
    if len(raws) > 1:
        raise ParamError(field.name, "given more than once; it takes one value")
    setattr(message, field.name, _parse(field, raws[0]))


def _parse(field: FieldDescriptor, raw: str) -> Any:
    name = field.name
    if field.type in _INT_MAX:
        top = _INT_MAX[field.type]
        if not _DIGITS.fullmatch(raw) or int(raw) > top:
            raise ParamError(name, f"must be a whole number from 0 to {top}, got {raw[:40]!r}")
        return int(raw)
    if field.type in _FLOATS:
        try:
            number = float(raw)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            raise ParamError(name, f"must be a finite number, got {raw[:40]!r}")
        return number
    if field.type == _F.TYPE_BOOL:
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise ParamError(name, f"must be true or false, got {raw[:40]!r}")
    if field.type == _F.TYPE_ENUM:
        return _enum(field, raw)
    if "\x00" in raw:
        raise ParamError(name, "must not contain a NUL character")
    return raw


def _enum(field: FieldDescriptor, raw: str) -> int:
    enum = enum_of(field)
    prefix = enum_prefix(enum)
    wanted = raw.upper()
    for value in enum.values:
        if value.number != 0 and wanted in (value.name, value.name.removeprefix(prefix)):
            return int(value.number)
    choices = ", ".join(enum_choices(enum))
    raise ParamError(field.name, f"must be one of {choices}, got {raw[:40]!r}")
