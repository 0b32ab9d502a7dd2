"""The HTTP API's OpenAPI 3.1 document, derived from the routes and the proto descriptors.

Response schemas are JSON Schema generated from each message's `Descriptor.fields`, in
the shape `json_format.MessageToDict` gives them (proto field names; enums by name;
64-bit integers as numbers when a double holds them exactly, as strings otherwise;
Timestamp as an RFC 3339 string). Parameters come from the request messages' fields.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor

from assay import __version__
from assay.master.api._http_params import body_fields, enum_choices, enum_of, query_fields
from assay.master.api._http_routes import PREFIX, ROUTES, Route
from assay.master.auth import PUBLIC_RPC_NAMES

Schema = dict[str, Any]
_F = FieldDescriptor
_REF = "#/components/schemas/"
_INT32 = {
    _F.TYPE_INT32: (-(2**31), 2**31 - 1),
    _F.TYPE_SINT32: (-(2**31), 2**31 - 1),
    _F.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    _F.TYPE_UINT32: (0, 2**32 - 1),
    _F.TYPE_FIXED32: (0, 2**32 - 1),
}
_INT64 = {_F.TYPE_INT64, _F.TYPE_SINT64, _F.TYPE_SFIXED64, _F.TYPE_UINT64, _F.TYPE_FIXED64}
_NUMBER: Schema = {
    "anyOf": [{"type": "number"}, {"type": "string", "enum": ["NaN", "Infinity", "-Infinity"]}]
}
_WELL_KNOWN: dict[str, Schema] = {
    "google.protobuf.Timestamp": {"type": "string", "format": "date-time"},
    "google.protobuf.Duration": {"type": "string", "pattern": r"^-?[0-9]+(\.[0-9]+)?s$"},
    "google.protobuf.Struct": {"type": "object", "additionalProperties": True},
    "google.protobuf.Value": {},
    "google.protobuf.ListValue": {"type": "array"},
}
ERROR_SCHEMA: Schema = {
    "type": "object",
    "properties": {"error": {"type": "string", "description": "what was wrong, and how to fix it"}},
    "required": ["error"],
}
_ERRORS = {
    "400": "A parameter is malformed or out of range (the message names it)",
    "401": "No valid session token (none, expired, revoked or wrong): log in again",
    "403": "Refused: not yours to change, administrators only, or from another site's page",
    "404": "No such experiment, trial or checkpoint",
    "409": "The action does not apply in the current state",
    "429": "Too many failed logins from this address or for this user: retry later",
    "503": "The master cannot serve the call now (its database is unavailable)",
}


def message_schema(descriptor: Descriptor, components: dict[str, Schema]) -> Schema:
    """A schema for `descriptor`'s JSON form: a `$ref` into `components`, which is filled
    with it and every message and enum it refers to."""
    name = descriptor.full_name
    if name in _WELL_KNOWN:
        return dict(_WELL_KNOWN[name])
    if name not in components:
        components[name] = {}  # claimed first: a message may refer to itself
        properties = {f.name: _field_schema(f, components) for f in descriptor.fields}
        schema: Schema = {"type": "object", "properties": properties}
        # MessageToDict(always_print_fields_with_no_presence=True) always prints these.
        required = [f.name for f in descriptor.fields if not f.has_presence]
        if required:
            schema["required"] = required
        components[name] = schema
    return {"$ref": _REF + name}


def _enum_schema(enum: EnumDescriptor, components: dict[str, Schema]) -> Schema:
    components.setdefault(enum.full_name, {"type": "string", "enum": [v.name for v in enum.values]})
    return {"$ref": _REF + enum.full_name}


def _field_schema(field: FieldDescriptor, components: dict[str, Schema]) -> Schema:
    message = field.message_type
    if message is not None and message.GetOptions().map_entry:
        value = _value_schema(message.fields_by_name["value"], components)
        return {"type": "object", "additionalProperties": value}
    schema = _value_schema(field, components)
    if field.is_repeated:
        return {"type": "array", "items": schema}
    return schema


def _value_schema(field: FieldDescriptor, components: dict[str, Schema]) -> Schema:
    kind = field.type
    if kind in _INT32:
        low, high = _INT32[kind]
        return {"type": "integer", "format": "int32", "minimum": low, "maximum": high}
    if kind in _INT64:
        # A number up to 2**53, a decimal string beyond (json_format's unquoting).
        return {"type": ["integer", "string"], "format": "int64"}
    if kind in (_F.TYPE_DOUBLE, _F.TYPE_FLOAT):
        return dict(_NUMBER)
    if kind == _F.TYPE_BOOL:
        return {"type": "boolean"}
    if kind == _F.TYPE_STRING:
        return {"type": "string"}
    if kind == _F.TYPE_BYTES:
        return {"type": "string", "contentEncoding": "base64"}
    if kind == _F.TYPE_ENUM:
        return _enum_schema(enum_of(field), components)
    message = field.message_type
    if message is None:
        raise TypeError(f"{field.full_name} has an unknown type {kind}")
    return message_schema(message, components)


def _param_schema(field: FieldDescriptor) -> Schema:
    """A parameter's schema: what `_http_params.build_request` accepts for the field."""
    kind = field.type
    schema: Schema
    if kind in _INT32 or kind in _INT64:
        high = _INT32[kind][1] if kind in _INT32 else 2**63 - 1
        schema = {"type": "integer", "minimum": 0, "maximum": high}
    elif kind in (_F.TYPE_DOUBLE, _F.TYPE_FLOAT):
        schema = {"type": "number"}
    elif kind == _F.TYPE_BOOL:
        schema = {"type": "boolean"}
    elif kind == _F.TYPE_ENUM:
        schema = {"type": "string", "enum": enum_choices(enum_of(field))}
    else:
        schema = {"type": "string"}
    if field.is_repeated:
        return {"type": "array", "items": schema}
    return schema


def _parameters(route: Route) -> list[Schema]:
    by_name = route.request.fields_by_name
    params: list[Schema] = [
        {"name": name, "in": "path", "required": True, "schema": _param_schema(by_name[name])}
        for name in route.path_fields
    ]
    if route.body:
        return params
    for field in query_fields(route.request, route.taken):
        param: Schema = {"name": field.name, "in": "query", "schema": _param_schema(field)}
        if field.type == _F.TYPE_ENUM:
            param["description"] = "case-insensitive; the full enum name is accepted too"
        if field.is_repeated:
            param["description"] = "repeat the parameter for more than one value"
        if field.name in route.one_of:
            others = " or ".join(route.one_of)
            param["description"] = f"give exactly one of {others}"
        params.append(param)
    return params


def _operation(route: Route, components: dict[str, Schema]) -> Schema:
    body = message_schema(route.response, components)
    content: Schema
    if route.streams:
        content = {
            "application/json": {"schema": {"type": "array", "items": body}},
            "text/event-stream": {
                "schema": {
                    "type": "string",
                    "description": "with follow=true: one `data: <JSON>` event per item, "
                    "then an `end` event when the stream is over",
                },
            },
        }
    else:
        content = {"application/json": {"schema": body}}
    responses: Schema = {"200": {"description": route.response.name, "content": content}}
    for status in _ERRORS:
        responses[status] = {"$ref": f"#/components/responses/{status}"}
    operation: Schema = {
        "operationId": route.operation_id,
        "summary": route.summary,
        "parameters": _parameters(route),
        "responses": responses,
        "x-grpc-method": route.descriptor.full_name,
    }
    if route.fixed:
        operation["x-grpc-fields"] = dict(route.fixed)
    if route.descriptor.full_name in PUBLIC_RPC_NAMES:
        operation["security"] = []  # the one call that needs no token
    if route.body:
        fields = body_fields(route.request, route.taken)
        properties = {f.name: _field_schema(f, components) for f in fields}
        schema: Schema = {"type": "object", "properties": properties}
        operation["requestBody"] = {
            "required": True,
            "description": f"{route.request.name} as JSON (proto or lowerCamel field names), "
            f"at most {route.max_body} bytes",
            "content": {"application/json": {"schema": schema}},
        }
        responses["413"] = {
            "description": "The body is over the route's limit",
            "content": {"application/json": {"schema": {"$ref": _REF + "Error"}}},
        }
    return operation


def _plain(description: str, schema: Schema) -> Schema:
    content = {"application/json": {"schema": schema}}
    return {"responses": {"200": {"description": description, "content": content}}}


def openapi_document() -> Schema:
    """The OpenAPI 3.1 document of every route under PREFIX."""
    components: dict[str, Schema] = {"Error": ERROR_SCHEMA}
    paths: dict[str, Schema] = {}
    for route in ROUTES:
        paths.setdefault(route.url, {})[route.method.lower()] = _operation(route, components)
    health = {"type": "object", "properties": {"status": {"const": "ok"}}, "required": ["status"]}
    paths[PREFIX + "/health"] = {
        "get": {"operationId": "Health", "security": [], **_plain("Serving", health)}
    }
    document = {"type": "object", "description": "this document"}
    paths[PREFIX + "/openapi.json"] = {
        "get": {"operationId": "OpenApi", **_plain("OpenAPI 3.1", document)}
    }
    error_content = {"application/json": {"schema": {"$ref": _REF + "Error"}}}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Assay master",
            "version": __version__,
            "description": "The JSON form of the gRPC API in proto/api.proto "
            "(google.protobuf.json_format, proto field names).",
        },
        "paths": paths,
        "security": [{"bearer": []}],
        "components": {
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "the token of POST /api/v1/login (or `assay user login`)",
                }
            },
            "schemas": dict(sorted(components.items())),
            "responses": {
                status: {"description": why, "content": error_content}
                for status, why in _ERRORS.items()
            },
        },
    }
