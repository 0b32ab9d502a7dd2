"""Who may call what: one check in front of every RPC (default deny).

Every gRPC call passes `GuardInterceptor` before any handler runs; the HTTP server asks
the same `Guard` in its middleware. The rules, by service:

- `Api`: a session token (`authorization: Bearer ast_...`) of an active user, except
  `Login`. Which experiments a user may change is the servicer's question (`Principal`).
- `AgentService`: the cluster's join token (`x-assay-join-token`) or an agent's own
  credential (`x-assay-agent-credential`, issued at its first join); a call with
  neither is refused before it registers, so nothing is ever scheduled on it. Which
  name a credential may register as is the servicer's question (`agent_pass()`, then
  `Fleet.check_credential`): a name whose credential was issued accepts no other.
- `TrialService`: the allocation token of a running allocation (`x-assay-token`); the
  servicer then checks that it belongs to the trial the call names.
- Anything else (an unknown service or method) is refused.

The HTTP server's `/metrics` (Prometheus) asks `admit_scrape`: the master's metrics token
(`metrics_token`) as `Authorization: Bearer <token>`, compared in constant time, unless
the operator opened it with `metrics: open`.

The guard resolves an Api call's session token once: handlers read the user it found
with `caller()` (a context variable, so it travels with the call to the thread pool,
and no other call sees it).
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from concurrent import futures
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import grpc

from assay.master.auth._auth import Authenticator, Principal
from assay.master.errors import AuthError, RateLimitedError

AUTH_HEADER = "authorization"
JOIN_TOKEN_HEADER = "x-assay-join-token"
AGENT_CREDENTIAL_HEADER = "x-assay-agent-credential"
ALLOCATION_TOKEN_HEADER = "x-assay-token"
API = "/assay.v1.Api/"
AGENTS = "/assay.v1.AgentService/"
TRIALS = "/assay.v1.TrialService/"
PUBLIC_RPCS = frozenset({API + "Login"})
# The same, as descriptors name them (assay.v1.Api.Login): what HTTP routes know.
PUBLIC_RPC_NAMES = frozenset(name.strip("/").replace("/", ".") for name in PUBLIC_RPCS)


# Who makes the Api call being served (set by the guard; None: not an Api call, or a
# handler called without the guard in front, as some tests do).
_CALLER: ContextVar[Principal | None] = ContextVar("assay_caller", default=None)


def caller() -> Principal | None:
    """The user the guard let the current call in as, or None."""
    return _CALLER.get()


@dataclass(frozen=True)
class AgentPass:
    """What an agent's call presented: the join token (checked) and its credential
    (not checked yet: the name it is for comes with the first message)."""

    joined: bool
    credential: str


# What the agent's call being served presented (set by the guard; None: no guard).
_AGENT_PASS: ContextVar[AgentPass | None] = ContextVar("assay_agent_pass", default=None)


def agent_pass() -> AgentPass | None:
    """What the guard let the current agent call in with, or None."""
    return _AGENT_PASS.get()


@contextmanager
def calling_as(who: Principal | None) -> Iterator[None]:
    """`caller()` is `who` inside the block (for a server that serves several calls in
    one task, as aiohttp does on a kept-alive connection)."""
    token = _CALLER.set(who)
    try:
        yield
    finally:
        _CALLER.reset(token)


class RefusedError(Exception):
    """A call without the right credentials; `code` and `message` are what the caller gets."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def bearer(metadata: Mapping[str, str]) -> str:
    """The token of an `authorization: Bearer <token>` entry, or ""."""
    value = metadata.get(AUTH_HEADER, "")
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def metadata_dict(metadata: Iterable[tuple[str, Any]] | None) -> dict[str, str]:
    """gRPC metadata as a dict of text values (binary entries are dropped)."""
    out: dict[str, str] = {}
    for key, value in metadata or ():
        if isinstance(value, str):
            out[key.lower()] = value
    return out


class Guard:
    """The credentials check of every call. Thread-safe."""

    def __init__(
        self,
        authenticator: Authenticator,
        join_token: str,
        allocation_ok: Callable[[str], bool],
        *,
        metrics_token: str | None = None,
        metrics_open: bool = False,
    ) -> None:
        """`metrics_token`: what a scrape of /metrics presents; with neither it nor
        `metrics_open`, every scrape is refused."""
        if not join_token:
            raise ValueError("a join token is required")
        self.auth = authenticator
        self._join_token = join_token.encode()
        self._allocation_ok = allocation_ok
        self._metrics_token = metrics_token.encode() if metrics_token else None
        self._metrics_open = metrics_open

    def principal(self, metadata: Mapping[str, str]) -> Principal:
        """The user a call's session token belongs to; `AuthError` if none."""
        token = bearer(metadata)
        if not token:
            raise AuthError(
                "this call needs a session token: log in with `assay user login` (or set "
                "ASSAY_USER and ASSAY_PASSWORD), or send `Authorization: Bearer <token>`"
            )
        return self.auth.authenticate(token)

    async def principal_async(
        self, metadata: Mapping[str, str], pool: futures.Executor
    ) -> Principal:
        """`principal` for a coroutine: from the cache when it can, else on `pool` (a
        cache miss reads the store, which must not block the event loop)."""
        token = bearer(metadata)
        found = self.auth.cached(token) if token else None
        if found is not None:
            return found
        if not token:
            return self.principal(metadata)  # refused without reading anything
        return await asyncio.get_running_loop().run_in_executor(pool, self.principal, metadata)

    def join_token_ok(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self._join_token)

    def admit_scrape(self, authorization: str) -> None:
        """Let a scrape of /metrics through, or raise `AuthError` (its `Authorization`
        header is the metrics token as a bearer token)."""
        if self._metrics_open:
            return
        given = bearer({AUTH_HEADER: authorization}).encode()
        if self._metrics_token is None or not hmac.compare_digest(given, self._metrics_token):
            raise AuthError(
                "/metrics needs the master's metrics token: send `Authorization: Bearer "
                "<metrics_token>` (Prometheus: `authorization: {credentials_file: FILE}`)"
            )

    async def admit(self, method: str, metadata: Mapping[str, str], pool: futures.Executor) -> None:
        """Let the call through, or raise `RefusedError`. An Api call's user is what
        `caller()` gives for the rest of the call (`pool`: where a token this process has
        not seen lately is looked up)."""
        if method.startswith(API):
            if method not in PUBLIC_RPCS:
                try:
                    _CALLER.set(await self.principal_async(metadata, pool))
                except AuthError as e:
                    raise RefusedError(grpc.StatusCode.UNAUTHENTICATED, str(e)) from None
            return
        self.check(method, metadata)

    def check(self, method: str, metadata: Mapping[str, str]) -> None:
        """`admit` for the calls of agents and trials (no database read): let the call
        through, or raise `RefusedError`."""
        if method.startswith(AGENTS):
            joined = self.join_token_ok(metadata.get(JOIN_TOKEN_HEADER, ""))
            credential = metadata.get(AGENT_CREDENTIAL_HEADER, "")
            if not joined and not credential:
                raise RefusedError(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "this agent did not present the cluster's join token: set `join_token` "
                    "in the agent's config (or ASSAY_JOIN_TOKEN) to the master's",
                )
            _AGENT_PASS.set(AgentPass(joined, credential))
            return
        if method.startswith(TRIALS):
            if not self._allocation_ok(metadata.get(ALLOCATION_TOKEN_HEADER, "")):
                raise RefusedError(
                    grpc.StatusCode.PERMISSION_DENIED,
                    "this call does not carry the token of a running allocation",
                )
            return
        raise RefusedError(grpc.StatusCode.UNIMPLEMENTED, f"no such method: {method}")


class GuardInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Runs `Guard.admit` before every handler of the aio server; a refused call gets the
    refusal's status and the handler never runs."""

    def __init__(self, guard: Guard, pool: futures.Executor) -> None:
        self.guard = guard
        self.pool = pool

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = str(handler_call_details.method)
        metadata = metadata_dict(handler_call_details.invocation_metadata)
        try:
            # In the call's own task: what `admit` records is the handler's `caller()`.
            await self.guard.admit(method, metadata, self.pool)
        except RefusedError as e:
            return _refusal(e)
        return await continuation(handler_call_details)


def _refusal(refused: RefusedError) -> grpc.RpcMethodHandler:
    """A handler that answers with the refusal without reading the request: streaming
    in, with no deserializer, whatever the method's shape (the wire format is the same),
    so a refused caller's body is neither buffered nor parsed."""

    async def deny(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(refused.code, refused.message)
        yield  # pragma: no cover - an async generator that never yields

    return grpc.stream_stream_rpc_method_handler(deny)


__all__ = [
    "AgentPass",
    "AuthError",
    "Guard",
    "GuardInterceptor",
    "RateLimitedError",
    "RefusedError",
    "agent_pass",
    "caller",
    "calling_as",
]
