"""TLS: a master serving gRPC and HTTPS with a certificate of a CA made for the test, and
the clients that verify it (gRPC stubs, the CLI, an agent process and its trial)."""

from __future__ import annotations

import datetime as dt
import http.client
import ipaddress
import json
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from assay.agent._config import load_agent_settings
from assay.common.settings import SettingsError
from assay.common.tls import ClientTls, ServerTls, TlsError
from assay.master._config import MasterConfig, load_master_config
from assay.master._server import MasterServer
from assay.proto import api_pb2, api_pb2_grpc
from tests.conftest import REGRESSION_DIR, regression_config
from tests.credentials import ADMIN_PASSWORD, JOIN_TOKEN, master_config

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 10.0


# --- a CA and its certificates ------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA's certificate: what clients trust
    cert: Path  # the master's: localhost and 127.0.0.1, signed by the CA
    key: Path
    other_key: Path  # a key of no certificate here
    encrypted_key: Path  # `key` under a passphrase
    junk: Path  # not PEM


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey, password: bytes | None = None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password)
        if password
        else serialization.NoEncryption()
    )
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )


def make_pki(directory: Path) -> Pki:
    now = dt.datetime.now(dt.UTC)
    ca_key, key = _key(), _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "assay test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pki = Pki(
        ca=directory / "ca.pem",
        cert=directory / "master.pem",
        key=directory / "master-key.pem",
        other_key=directory / "other-key.pem",
        encrypted_key=directory / "encrypted-key.pem",
        junk=directory / "junk.pem",
    )
    pki.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pki.key.write_bytes(_pem_key(key))
    pki.other_key.write_bytes(_pem_key(_key()))
    pki.encrypted_key.write_bytes(_pem_key(key, b"secret"))
    pki.junk.write_text("not a certificate\n")
    return pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _config(state_dir: Path, cert: Path | None, key: Path | None) -> MasterConfig:
    return master_config(
        state_dir=state_dir,
        heartbeat_interval_s=0.5,
        tls_cert=cert,
        tls_key=key,
    )


@pytest.fixture(scope="module")
def master(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MasterServer]:
    server = MasterServer(_config(tmp_path_factory.mktemp("master"), pki.cert, pki.key))
    server.start()
    yield server
    server.stop(grace=0.5)


def _address(master: MasterServer) -> str:
    return f"127.0.0.1:{master.port}"


def _login(channel: grpc.Channel) -> str:
    stub = api_pb2_grpc.ApiStub(channel)
    request = api_pb2.LoginRequest(username="admin", password=ADMIN_PASSWORD)
    token: str = stub.Login(request, timeout=TIMEOUT).token
    return token


def _refusal(channel: grpc.Channel) -> grpc.RpcError:
    with channel, pytest.raises(grpc.RpcError) as caught:
        _login(channel)
    return caught.value


# --- gRPC -----------------------------------------------------------------------------------


def test_a_client_trusting_the_ca_logs_in_and_lists_experiments(
    master: MasterServer, pki: Pki
) -> None:
    with ClientTls(True, pki.ca).channel(_address(master)) as channel:
        token = _login(channel)
        stub = api_pb2_grpc.ApiStub(channel)
        listed = stub.ListExperiments(
            api_pb2.ListExperimentsRequest(),
            timeout=TIMEOUT,
            metadata=(("authorization", f"Bearer {token}"),),
        )
    assert list(listed.experiments) == []


def test_a_plaintext_client_gets_nothing(master: MasterServer) -> None:
    error = _refusal(grpc.insecure_channel(_address(master)))
    assert error.code() == grpc.StatusCode.UNAVAILABLE


def test_a_client_with_the_system_roots_does_not_trust_a_private_ca(master: MasterServer) -> None:
    error = _refusal(ClientTls(True).channel(_address(master)))
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "handshake" in (error.details() or "").lower()


def test_the_server_name_override_is_the_name_checked(master: MasterServer, pki: Pki) -> None:
    with ClientTls(True, pki.ca, "localhost").channel(_address(master)) as channel:
        assert _login(channel)
    error = _refusal(ClientTls(True, pki.ca, "master.example").channel(_address(master)))
    assert error.code() == grpc.StatusCode.UNAVAILABLE


# --- HTTP -----------------------------------------------------------------------------------


def test_https_serves_the_api_to_a_client_trusting_the_ca(master: MasterServer, pki: Pki) -> None:
    context = ssl.create_default_context(cafile=str(pki.ca))
    conn = http.client.HTTPSConnection("127.0.0.1", master.http_port, context=context, timeout=5)
    try:
        conn.request("GET", "/api/v1/health")
        response = conn.getresponse()
        assert response.status == 200
        assert json.loads(response.read()) == {"status": "ok"}
    finally:
        conn.close()


def test_plain_http_and_unverified_https_are_refused(master: MasterServer) -> None:
    def plain_get() -> None:
        plain = http.client.HTTPConnection("127.0.0.1", master.http_port, timeout=5)
        try:
            plain.request("GET", "/api/v1/health")
            plain.getresponse()
        finally:
            plain.close()

    with pytest.raises((http.client.HTTPException, OSError)):
        plain_get()
    system = http.client.HTTPSConnection(
        "127.0.0.1", master.http_port, context=ssl.create_default_context(), timeout=5
    )
    with pytest.raises(ssl.SSLCertVerificationError):
        system.request("GET", "/api/v1/health")
    system.close()


# --- the CLI --------------------------------------------------------------------------------


def _cli(master: MasterServer, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ASSAY_TLS")}
    clean.pop("ASSAY_CA_FILE", None)
    return subprocess.run(
        [sys.executable, "-m", "assay.cli.main", "-m", _address(master), *args],
        capture_output=True,
        text=True,
        env={**clean, **env},
        timeout=120,
        cwd=ROOT,
        check=False,
    )


def test_the_cli_verifies_the_master_with_assay_ca_file(master: MasterServer, pki: Pki) -> None:
    done = _cli(master, {"ASSAY_CA_FILE": str(pki.ca)}, "user", "whoami")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"admin (admin) on {_address(master)}"

    refused = _cli(master, {"ASSAY_TLS": "true"}, "user", "whoami")  # the system's roots
    assert refused.returncode == 1
    # (gRPC's own log line on the failed handshake may come first.)
    assert refused.stderr.splitlines()[-1].startswith("error: cannot reach the master")

    missing = _cli(master, {"ASSAY_CA_FILE": str(pki.ca) + ".missing"}, "user", "whoami")
    assert missing.returncode == 1
    assert missing.stderr.strip() == (
        f"error: ca_file (ASSAY_CA_FILE) {pki.ca}.missing: cannot read it "
        "(No such file or directory)"
    )


# --- settings, and a master that refuses to start -------------------------------------------


def test_client_settings_from_the_environment_and_back(
    tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert ClientTls.from_env({}) == ClientTls()
    assert ClientTls.from_env({"ASSAY_TLS": "yes"}) == ClientTls(True)
    # A CA file turns TLS on, unless ASSAY_TLS says otherwise.
    assert ClientTls.from_env({"ASSAY_CA_FILE": str(pki.ca)}) == ClientTls(True, pki.ca)
    assert ClientTls.from_env({"ASSAY_CA_FILE": str(pki.ca), "ASSAY_TLS": "0"}) == ClientTls()
    with pytest.raises(TlsError, match="ASSAY_TLS='maybe': expected true or false"):
        ClientTls.from_env({"ASSAY_TLS": "maybe"})

    monkeypatch.chdir(tmp_path)  # a relative CA file is made absolute: children run elsewhere
    (tmp_path / "ca.pem").write_bytes(pki.ca.read_bytes())
    tls = ClientTls.of(None, Path("ca.pem"), "localhost")
    assert tls == ClientTls(True, tmp_path / "ca.pem", "localhost")
    env = {"ASSAY_CA_FILE": "/stale.pem", "ASSAY_TLS_SERVER_NAME": "stale", "PATH": "/bin"}
    tls.export(env)
    assert ClientTls.from_env(env) == tls
    ClientTls().export(env)
    assert env == {"ASSAY_TLS": "false", "PATH": "/bin"}


def test_the_daemons_take_the_tls_keys_from_file_environment_and_flags(
    tmp_path: Path, pki: Pki
) -> None:
    file = tmp_path / "master.yaml"
    file.write_text(yaml.safe_dump({"tls_cert": str(pki.cert)}))
    config = load_master_config(file, {}, env={"ASSAY_TLS_KEY": str(pki.key)})
    assert (config.tls_cert, config.tls_key) == (pki.cert, pki.key)

    flags = {"master": "127.0.0.1:1", "ca_file": str(pki.ca), "tls_server_name": "localhost"}
    settings = load_agent_settings(None, flags, env={})
    assert settings.client_tls == ClientTls(True, pki.ca, "localhost")
    off = load_agent_settings(None, {**flags, "tls": "false"}, env={})
    assert off.client_tls == ClientTls()
    plain = load_agent_settings(None, {"master": "127.0.0.1:1"}, env={"ASSAY_TLS": "1"})
    assert plain.client_tls == ClientTls(True)
    with pytest.raises(SettingsError, match=r"ca_file \(ASSAY_CA_FILE\) .*: no PEM certificate"):
        load_agent_settings(None, {**flags, "ca_file": str(pki.junk)}, env={})


def _refused(pki: Pki, tmp_path: Path, cert: Path | None, key: Path | None) -> str:
    state = tmp_path / "state"
    with pytest.raises(TlsError) as caught:
        MasterServer(_config(state, cert, key))
    assert not state.exists()  # refused before anything was made
    return str(caught.value)


def test_a_master_with_unusable_tls_files_refuses_to_start(pki: Pki, tmp_path: Path) -> None:
    assert _refused(pki, tmp_path, pki.cert, None) == (
        "tls_cert is set but tls_key is not: TLS needs both the certificate chain (tls_cert) "
        "and its private key (tls_key); set tls_key (ASSAY_TLS_KEY, --tls-key) or unset tls_cert"
    )
    assert _refused(pki, tmp_path, None, pki.key).startswith("tls_key is set but tls_cert is not")
    assert _refused(pki, tmp_path, pki.cert, pki.other_key) == (
        f"tls_key {pki.other_key} does not belong to tls_cert {pki.cert}: the certificate's "
        "public key is not this key's"
    )
    missing = tmp_path / "nowhere.pem"
    assert _refused(pki, tmp_path, missing, pki.key) == (
        f"tls_cert {missing}: cannot read it (No such file or directory)"
    )
    assert _refused(pki, tmp_path, pki.junk, pki.key) == (
        f"tls_cert {pki.junk}: not a PEM certificate chain (-----BEGIN CERTIFICATE----- blocks)"
    )
    assert _refused(pki, tmp_path, pki.cert, pki.junk) == (
        f"tls_key {pki.junk}: not a PEM private key (a -----BEGIN ... PRIVATE KEY----- block)"
    )
    assert _refused(pki, tmp_path, pki.cert, pki.encrypted_key).startswith(
        f"tls_key {pki.encrypted_key}: the key is encrypted"
    )
    assert ServerTls.load(None, None) is None


def test_assay_master_says_why_it_will_not_start(pki: Pki, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "assay.master.main",
            "--state-dir",
            str(tmp_path / "state"),
            "--tls-cert",
            str(pki.cert),
            "--tls-key",
            str(pki.other_key),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: tls_key {pki.other_key} does not belong to tls_cert {pki.cert}: the "
        "certificate's public key is not this key's"
    )


# --- an agent process, and the trial it runs -----------------------------------------------


def _agents(master: MasterServer, pki: Pki) -> list[str]:
    with ClientTls(True, pki.ca).channel(_address(master)) as channel:
        token = _login(channel)
        response = api_pb2_grpc.ApiStub(channel).ListAgents(
            api_pb2.ListAgentsRequest(),
            timeout=TIMEOUT,
            metadata=(("authorization", f"Bearer {token}"),),
        )
    return [a.id for a in response.agents]


@pytest.mark.slow
def test_an_agent_joins_over_tls_and_its_trial_reports_over_tls(
    master: MasterServer, pki: Pki, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASSAY_TLS", "ASSAY_CA"))}
    env["ASSAY_MASTER_RETRY_S"] = "10"  # a trial that cannot reach the master fails soon
    log = tmp_path / "agent.log"
    with log.open("w") as out:
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "assay.agent",
                "--master",
                _address(master),
                "--join-token",
                JOIN_TOKEN,
                "--ca-file",
                str(pki.ca),
                "--agent-id",
                "tls-agent",
                "--slot-type",
                "cpu",
                "--slots",
                "1",
                "--work-dir",
                str(tmp_path / "work"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        deadline = time.monotonic() + 60
        while "tls-agent" not in _agents(master, pki):
            assert agent.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)

        config = tmp_path / "config.yaml"
        settings = {**regression_config(batches=8, validation_period=4), "max_restarts": 0}
        config.write_text(yaml.safe_dump(settings))
        tls_env = {"ASSAY_CA_FILE": str(pki.ca)}
        created = _cli(
            master, tls_env, "experiment", "create", str(config), str(REGRESSION_DIR), "--json"
        )
        assert created.returncode == 0, created.stderr
        experiment = str(json.loads(created.stdout.strip().splitlines()[-1])["id"])
        waited = _cli(master, tls_env, "experiment", "wait", experiment)
        assert waited.returncode == 0, f"{waited.stderr}\n{log.read_text()}"
        described = _cli(master, tls_env, "experiment", "describe", experiment, "--json")
        result = json.loads(described.stdout.strip().splitlines()[-1])
        assert result["state"] == "COMPLETED", log.read_text()
        [trial] = result["trials"]
        assert trial["total_batches"] == 8  # reported by the trial process, over TLS
    finally:
        agent.terminate()
        agent.wait(timeout=30)
