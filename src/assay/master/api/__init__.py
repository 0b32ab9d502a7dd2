"""The master's public API on the wire: the gRPC servicers (users', agents' and trials'
services), the HTTP server with its JSON routes, their OpenAPI document and the web UI's
files, and the one mapping of domain errors to gRPC status and HTTP codes.

Handlers are thin: they parse a request, check who may do it, call the shell (`Master`)
or the store, and answer. Everything below them speaks plain values.
"""

from assay.master.api._http import METRICS_PATH, HttpServer, start_http
from assay.master.api._http_calls import CallError
from assay.master.api._http_openapi import openapi_document
from assay.master.api._http_params import (
    ParamError,
    body_fields,
    build_body_request,
    build_request,
    enum_choices,
    enum_of,
    query_fields,
)
from assay.master.api._http_routes import PREFIX, ROUTES, Route
from assay.master.api._http_ui import BUILD_COMMAND, DEFAULT_UI_DIR, WebUi
from assay.master.api._servicers import AgentServicer, ApiServicer, TrialServicer
from assay.master.api._status import (
    DATA_ERROR,
    INTERNAL_ERROR,
    STORE_UNAVAILABLE,
    CallAbortedError,
    maps_errors,
    maps_errors_async,
    maps_errors_stream,
    status_of,
)

__all__ = [
    "AgentServicer",
    "ApiServicer",
    "BUILD_COMMAND",
    "CallAbortedError",
    "CallError",
    "DATA_ERROR",
    "DEFAULT_UI_DIR",
    "HttpServer",
    "INTERNAL_ERROR",
    "METRICS_PATH",
    "PREFIX",
    "ParamError",
    "ROUTES",
    "Route",
    "STORE_UNAVAILABLE",
    "TrialServicer",
    "WebUi",
    "body_fields",
    "build_body_request",
    "build_request",
    "enum_choices",
    "enum_of",
    "maps_errors",
    "maps_errors_async",
    "maps_errors_stream",
    "openapi_document",
    "query_fields",
    "start_http",
    "status_of",
]
