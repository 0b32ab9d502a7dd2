"""TLS between the master and everything that talks to it.

The master serves gRPC and HTTP with one certificate chain and key (`tls_cert`,
`tls_key`); `ServerTls` loads and checks them once, at start. Its clients (the CLI,
agents and the trial processes agents start) connect with `ClientTls`: plain, or TLS
verified against a CA bundle (`ca_file`) or, without one, the system's roots. Clients
take it from ASSAY_TLS, ASSAY_CA_FILE and ASSAY_TLS_SERVER_NAME; an agent also from its
settings, and it passes its own to its trial processes through the same variables
(`ClientTls.export`), so a trial reaches the master exactly as its agent does.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from assay.common.settings import Boolean, FilePath
from assay.errors import AssayError

TLS_ENV = "ASSAY_TLS"
CA_FILE_ENV = "ASSAY_CA_FILE"
SERVER_NAME_ENV = "ASSAY_TLS_SERVER_NAME"


class TlsError(AssayError):
    """A certificate, key or CA file that cannot be used; the message names the setting."""


@dataclass(frozen=True)
class PemFile(FilePath):
    """A path to a PEM file (whether it is readable is checked where it is used)."""

    form: str = "a PEM file path"


class _EncryptedKeyError(Exception):
    pass


def _refuse_password() -> str:
    # Without a callback OpenSSL would prompt on the terminal for the key's passphrase.
    raise _EncryptedKeyError


def _read(path: Path, setting: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise TlsError(f"{setting} {path}: cannot read it ({e.strerror or e})") from None


class ServerTls:
    """The master's certificate chain and key, checked to be PEM and to belong together."""

    def __init__(self, cert_file: Path, key_file: Path) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.cert = _read(cert_file, "tls_cert")
        self.key = _read(key_file, "tls_key")
        try:
            ssl.create_default_context(cadata=self.cert.decode("ascii", "replace"))
        except (ssl.SSLError, ValueError):
            raise TlsError(
                f"tls_cert {cert_file}: not a PEM certificate chain "
                "(-----BEGIN CERTIFICATE----- blocks)"
            ) from None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(cert_file, key_file, password=_refuse_password)
        except _EncryptedKeyError:
            raise TlsError(
                f"tls_key {key_file}: the key is encrypted; give the key without a passphrase "
                "(openssl pkey -in KEY -out KEY.plain) and keep the file readable by the "
                "master only"
            ) from None
        except ssl.SSLError as e:
            if e.reason == "KEY_VALUES_MISMATCH":
                raise TlsError(
                    f"tls_key {key_file} does not belong to tls_cert {cert_file}: the "
                    "certificate's public key is not this key's"
                ) from None
            raise TlsError(
                f"tls_key {key_file}: not a PEM private key "
                "(a -----BEGIN ... PRIVATE KEY----- block)"
            ) from None
        except OSError as e:
            raise TlsError(f"tls_key {key_file}: cannot read it ({e.strerror or e})") from None
        self.ssl_context = context

    @classmethod
    def load(cls, cert_file: Path | None, key_file: Path | None) -> ServerTls | None:
        """The master's TLS, or None when neither file is set; `TlsError` when only one
        is, or a file is unreadable or not what it should be."""
        if cert_file is None and key_file is None:
            return None
        if cert_file is None or key_file is None:
            given, missing = ("tls_cert", "tls_key")
            if cert_file is None:
                given, missing = missing, given
            raise TlsError(
                f"{given} is set but {missing} is not: TLS needs both the certificate chain "
                f"(tls_cert) and its private key (tls_key); set {missing} "
                f"(ASSAY_{missing.upper()}, --{missing.replace('_', '-')}) or unset {given}"
            )
        return cls(cert_file, key_file)

    def grpc_credentials(self) -> Any:
        import grpc

        return grpc.ssl_server_credentials([(self.key, self.cert)])


@dataclass(frozen=True)
class ClientTls:
    """How a client connects to the master: plain (the default) or TLS, verifying the
    master's certificate against `ca_file` (the system's roots when None), for the host
    name `server_name` when set (a master reached by IP address with a certificate issued
    to its name) rather than the one in the address."""

    enabled: bool = False
    ca_file: Path | None = None
    server_name: str | None = None

    @classmethod
    def of(cls, tls: bool | None, ca_file: Path | None, server_name: str | None) -> ClientTls:
        """TLS when `tls` says so; when `tls` is unset, when a CA file is given."""
        enabled = tls if tls is not None else ca_file is not None
        if not enabled:
            return cls()
        if ca_file is not None:
            ca_file = ca_file.expanduser().resolve()
        return cls(True, ca_file, server_name or None)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ClientTls:
        """From ASSAY_TLS (true/false), ASSAY_CA_FILE and ASSAY_TLS_SERVER_NAME."""
        env = os.environ if env is None else env
        raw = env.get(TLS_ENV, "").strip()
        tls: bool | None = None
        if raw:
            try:
                tls = bool(Boolean().parse(raw))
            except ValueError:
                raise TlsError(f"{TLS_ENV}={raw!r}: expected true or false") from None
        ca_file = env.get(CA_FILE_ENV, "").strip()
        return cls.of(tls, Path(ca_file) if ca_file else None, env.get(SERVER_NAME_ENV, "").strip())

    def root_certificates(self) -> bytes | None:
        """The CA bundle's bytes, checked to hold PEM certificates; None for the
        system's roots."""
        if self.ca_file is None:
            return None
        setting = f"ca_file ({CA_FILE_ENV})"
        data = _read(self.ca_file, setting)
        try:
            ssl.create_default_context(cadata=data.decode("ascii", "replace"))
        except (ssl.SSLError, ValueError):
            raise TlsError(
                f"{setting} {self.ca_file}: no PEM certificate in it "
                "(-----BEGIN CERTIFICATE----- blocks)"
            ) from None
        return data

    def channel_options(self) -> list[tuple[str, Any]]:
        if self.enabled and self.server_name:
            return [("grpc.ssl_target_name_override", self.server_name)]
        return []

    def channel(
        self, target: str, options: Sequence[tuple[str, Any]] = (), credentials: Any = None
    ) -> Any:
        """A `grpc.Channel` to `target`; `TlsError` for a CA file that cannot be used.
        `credentials` (from `credentials()`) saves reading the CA file for every channel
        of a client that opens many."""
        import grpc

        if not self.enabled:
            return grpc.insecure_channel(target, options=list(options))
        return grpc.secure_channel(
            target,
            credentials if credentials is not None else self.credentials(),
            options=[*options, *self.channel_options()],
        )

    def credentials(self) -> Any:
        """The `grpc.ChannelCredentials` (TLS only); build once, use for every channel."""
        import grpc

        return grpc.ssl_channel_credentials(root_certificates=self.root_certificates())

    def export(self, env: MutableMapping[str, str]) -> None:
        """Set the variables that make `from_env` in a child process give these settings
        (replacing any the parent had)."""
        env[TLS_ENV] = "true" if self.enabled else "false"
        for name, value in ((CA_FILE_ENV, self.ca_file), (SERVER_NAME_ENV, self.server_name)):
            if self.enabled and value is not None:
                env[name] = str(value)
            else:
                env.pop(name, None)


__all__ = [
    "CA_FILE_ENV",
    "SERVER_NAME_ENV",
    "TLS_ENV",
    "ClientTls",
    "PemFile",
    "ServerTls",
    "TlsError",
]
