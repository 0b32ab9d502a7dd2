"""The channel to the master: the connection, the session token it sends, and gRPC
errors as one-line messages.

grpc and the generated stubs are imported when the first call is made, never at import
time, so `assay --help` and `assay trial run-local` do not pay for them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from assay.common.tls import ClientTls

from . import _credentials
from ._errors import ERRORS, USER_CODES, MasterError

if TYPE_CHECKING:
    from assay.proto import api_pb2

UNARY_TIMEOUT_S = 30.0
MAX_MESSAGE_BYTES = 128 * 2**20  # above the 96 MiB model-definition limit


class Channel:
    """A lazily opened channel to `address` (HOST:PORT; HOST alone: port 8090)."""

    def __init__(
        self, address: str, timeout: float = UNARY_TIMEOUT_S, tls: ClientTls | None = None
    ) -> None:
        """`tls` None: as ASSAY_TLS, ASSAY_CA_FILE and ASSAY_TLS_SERVER_NAME say, read
        when the first call is made."""
        self.address = _credentials.dial_address(address)
        self.tls = tls
        self.timeout = timeout
        self._channel: Any = None
        self._stub: Any = None
        self._session_token: str | None = None
        self._token_given = False  # use_token: never replaced by an ASSAY_USER login

    @property
    def stub(self) -> Any:
        if self._stub is None:
            from assay.proto import api_pb2_grpc

            tls = ClientTls.from_env() if self.tls is None else self.tls
            self._channel = tls.channel(
                self.address,
                [
                    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ],
            )
            self._stub = api_pb2_grpc.ApiStub(self._channel)
        return self._stub

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = self._stub = None

    @contextmanager
    def _errors(self, timeout: float | None) -> Iterator[None]:
        import grpc

        try:
            yield
        except grpc.RpcError as e:
            translated = self._translate(e, timeout)
            translated.code = getattr(e.code(), "name", None)
            raise translated from None

    def _translate(self, error: Any, timeout: float | None) -> MasterError:
        code = error.code()
        name = getattr(code, "name", str(code))
        details = (error.details() or "").strip()
        if name == "UNAVAILABLE" and "http1" in details.lower().replace(".", ""):
            return MasterError(http_port_message(self.address))
        if name == "UNAVAILABLE":
            return MasterError(
                f"cannot reach the master at {self.address} "
                "(is assay-master running? set --master or ASSAY_MASTER)"
            )
        if name == "DEADLINE_EXCEEDED":
            waited = f" within {timeout:g} s" if timeout else ""
            return MasterError(f"the master at {self.address} did not answer{waited}")
        if name in USER_CODES and details:
            return ERRORS.get(name, MasterError)(details)
        return MasterError(
            f"the master at {self.address} failed the request ({name})"
            + (f": {details}" if details else "")
        )

    # --- credentials ------------------------------------------------------------------

    def _token(self) -> str:
        """The session token to send: the stored one, else one got by logging in with
        ASSAY_USER / ASSAY_PASSWORD, else none (the master then says to log in)."""
        if self._session_token is None:
            stored = _credentials.load_session(self.address)
            wanted = _credentials.env_credentials()
            # ASSAY_USER names who a script acts as: another user's stored token is not it.
            theirs = wanted is not None and stored is not None and stored.username != wanted[0]
            if stored is not None and stored.valid() and not theirs:
                self._session_token = stored.token
            elif _credentials.env_credentials() is not None:
                self._session_token = self._login_from_env()
            else:
                self._session_token = ""
        return self._session_token

    def use_token(self, token: str) -> None:
        """Send `token` (a session token from `assay user login` or the web UI) with
        every call, instead of a stored or ASSAY_USER session; nothing is saved."""
        self._session_token = token
        self._token_given = True

    def _login_from_env(self) -> str:
        found = _credentials.env_credentials()
        assert found is not None
        session = self.login(*found)
        return session.token

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        token = self._token()
        return (("authorization", f"Bearer {token}"),) if token else ()

    def _call(self, method: str, request: Any, timeout: float | None) -> Any:
        """One call with the session token; a token the master no longer takes is
        replaced once by a fresh login when ASSAY_USER / ASSAY_PASSWORD allow it. A list
        `request` is a client stream, sent again in full after such a login."""
        import grpc

        stub = getattr(self.stub, method)

        def send() -> Any:
            given = iter(request) if isinstance(request, list) else request
            return stub(given, timeout=timeout, metadata=self._metadata())

        try:
            return send()
        except grpc.RpcError as e:
            renew = e.code() == grpc.StatusCode.UNAUTHENTICATED and method != "Login"
            if not renew or self._token_given or _credentials.env_credentials() is None:
                raise
        self._session_token = self._login_from_env()
        return send()

    def _unary(self, method: str, request: Any, timeout: float | None = None) -> Any:
        timeout = timeout or self.timeout
        with self._errors(timeout):
            return self._call(method, request, timeout)

    def login(self, username: str, password: str) -> _credentials.StoredSession:
        """Log in, keep the token for this master in the auth file, and return it."""
        from assay.proto import api_pb2

        request = api_pb2.LoginRequest(username=username, password=password)
        with self._errors(self.timeout):
            response: api_pb2.LoginResponse = self.stub.Login(request, timeout=self.timeout)
        session = _credentials.StoredSession(
            response.user.username,
            response.token,
            response.expires_at.ToDatetime(tzinfo=dt.UTC),
        )
        _credentials.save_session(self.address, session)
        self._session_token = session.token
        return session

    def logout(self) -> bool:
        """End the stored session at the master and forget it here; False if none."""
        from assay.proto import api_pb2

        stored = _credentials.load_session(self.address)
        if stored is None:
            return False
        self._session_token = stored.token
        with contextlib.suppress(MasterError):  # expired or revoked already: forget it
            self._unary("Logout", api_pb2.LogoutRequest())
        _credentials.forget_session(self.address)
        self._session_token = None
        return True

    def who_am_i(self) -> api_pb2.User:
        from assay.proto import api_pb2

        user: api_pb2.User = self._unary("WhoAmI", api_pb2.WhoAmIRequest())
        return user

    def list_users(self) -> list[api_pb2.User]:
        from assay.proto import api_pb2

        response: api_pb2.ListUsersResponse = self._unary("ListUsers", api_pb2.ListUsersRequest())
        return list(response.users)

    def create_user(self, username: str, password: str, admin: bool) -> api_pb2.User:
        from assay.proto import api_pb2

        request = api_pb2.CreateUserRequest(username=username, password=password, admin=admin)
        user: api_pb2.User = self._unary("CreateUser", request)
        return user

    def change_password(self, username: str, old: str, new: str) -> api_pb2.User:
        from assay.proto import api_pb2

        request = api_pb2.ChangePasswordRequest(
            username=username, old_password=old, new_password=new
        )
        user: api_pb2.User = self._unary("ChangePassword", request)
        return user

    def set_user_active(self, username: str, active: bool) -> api_pb2.User:
        from assay.proto import api_pb2

        request = api_pb2.SetUserActiveRequest(username=username, active=active)
        user: api_pb2.User = self._unary("SetUserActive", request)
        return user


def http_port_message(address: str) -> str:
    """What to say when `address` answered in HTTP/1: most likely the master's web UI
    port, whose health check names the gRPC port (a header)."""
    import urllib.request

    host = address.rsplit(":", 1)[0]
    grpc_port = ""
    url = f"http://{address}/api/v1/health"
    # No answer: say what is known without it.
    with contextlib.suppress(Exception), urllib.request.urlopen(url, timeout=3) as reply:
        grpc_port = reply.headers.get("Assay-Grpc-Port", "")
    if grpc_port.isdigit():
        return (
            f"{address} is the web UI's port (HTTP); the gRPC port is {grpc_port}: use "
            f"--master {host}:{grpc_port} (or set ASSAY_MASTER)"
        )
    return (
        f"{address} answers HTTP, not gRPC: is it the web UI's port? Give --master the "
        "master's gRPC port (8090 unless its --grpc-port says otherwise)"
    )
