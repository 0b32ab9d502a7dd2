"""The master process: store, core and gRPC servers wired together."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import os
import stat
import threading
from concurrent import futures
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from assay.common.archive import MAX_MODEL_DEF_BYTES
from assay.common.tls import ServerTls
from assay.errors import AssayError
from assay.master._aio import GenericOnly, LoopThread, SyncAdapter
from assay.master._config import MasterConfig
from assay.master._core import Master
from assay.master._store_owner import StoreTakenError, own_store
from assay.master.api import AgentServicer, ApiServicer, HttpServer, TrialServicer
from assay.master.auth import Authenticator, Guard, GuardInterceptor
from assay.master.store import Store
from assay.master.telemetry import NO_TELEMETRY, SECRET_ARGS, MasterLogBuffer, Telemetry
from assay.proto import agent_pb2_grpc, api_pb2_grpc, trial_pb2_grpc

if TYPE_CHECKING:
    from assay.master.telemetry.prometheus import PrometheusTelemetry

log = logging.getLogger("assay.master")
# What the master takes in one message: gRPC refuses a bigger one from its length
# prefix, before buffering it. Model definitions over that come in pieces
# (CreateExperimentStream). Sent messages carry whole archives to the agents.
MAX_RECEIVE_BYTES = 4 * 2**20
MAX_SEND_BYTES = MAX_MODEL_DEF_BYTES + 2**20
MIN_JOIN_TOKEN = 16
MIN_JOIN_TOKEN_BITS = 64


def check_join_token(token: str, key: str = "join_token") -> None:
    """Refuse a join token (or the setting `key`'s token) an attacker could guess: too
    short, or too few different characters for its length (16 identical ones were once
    accepted). The estimate is length x log2(distinct characters), which a random hex
    token of 24 or more passes."""
    distinct = len(set(token))
    bits = len(token) * math.log2(distinct) if distinct > 1 else 0.0
    if len(token) < MIN_JOIN_TOKEN or bits < MIN_JOIN_TOKEN_BITS:
        raise AssayError(
            f"{key} is too easy to guess ({len(token)} characters, {distinct} "
            f"different); use at least {MIN_JOIN_TOKEN} random ones (openssl rand -hex 24), "
            "or leave it unset and the master makes one"
        )


class MasterServer:
    """A running master: `start()`, then `port`, then `stop()`."""

    def __init__(self, config: MasterConfig) -> None:
        # Checked first: a master that cannot serve TLS as configured must not start plain.
        self.tls = ServerTls.load(config.tls_cert, config.tls_key)
        try:
            _make_state_dir(config.state_dir, config.checkpoint_root)
        except OSError as e:
            raise AssayError(f"cannot create the state directory {config.state_dir}: {e}") from None
        self.config = config
        self.owner = own_store(config.database_url)
        # From here on (the store's migrations included), for `assay master logs`.
        self.master_logs = MasterLogBuffer()
        try:
            self.store = _open_store(config.database_url)
        except BaseException:
            self.master_logs.close()
            self.owner.release()
            raise
        # Blocking handlers (API, trial calls, agent registration) run here; threads
        # start on demand. Agents' streams hold none: they live on the event loop.
        self.pool = futures.ThreadPoolExecutor(
            max_workers=config.max_rpc_threads, thread_name_prefix="rpc"
        )
        self.loop = LoopThread("grpc-loop")
        self.fatal: BaseException | None = None
        try:
            ttl = dt.timedelta(seconds=config.session_ttl_s)
            self.auth = Authenticator(
                self.store,
                token_ttl=ttl,
                login_failures_per_minute=config.login_failures_per_minute,
            )
            if config.join_token is not None:
                check_join_token(config.join_token)
            self.join_token = config.join_token or self.store.secret("join_token").hex()
            generated = self.auth.bootstrap_admin(config.initial_admin_password)
        except BaseException:
            self._unwind()
            raise
        if generated is not None:
            # Printed once: the store keeps only its hash.
            log.warning(
                "created user admin with the password %s -- log in with `assay user login "
                "admin` and change it with `assay user change-password`",
                generated,
                extra={SECRET_ARGS: True},  # not in `assay master logs`
            )
        if config.join_token is None:
            _write_private(config.state_dir / "join-token", self.join_token + "\n")
        # Prometheus's counters and the scrape's token (none when `metrics` is off).
        self.prometheus, metrics_token = self._metrics_setup(config)
        self.telemetry: Telemetry = self.prometheus or NO_TELEMETRY
        self.guard = Guard(
            self.auth,
            self.join_token,
            self._allocation_ok,
            metrics_token=metrics_token,
            metrics_open=config.metrics == "open",
        )
        interceptors: list[grpc.aio.ServerInterceptor] = [GuardInterceptor(self.guard, self.pool)]
        if self.prometheus is not None:
            interceptors.append(self.prometheus.interceptor())  # times what the guard admits
        try:
            self.server, self.port = self.loop.call(
                lambda: self._bind(config, interceptors, self.tls)
            )
        except BaseException:
            self._unwind()
            raise
        if self.port == 0:
            self._unwind()
            raise AssayError(
                f"cannot listen on {config.host}:{config.grpc_port}: the port is in use or the "
                "address is not this machine's; pick another with --grpc-port / --host"
            )
        if config.grpc_port == 0:
            config = _with_port(config, self.port)
            self.config = config
        self.master = Master(config, self.store, on_fatal=self._on_fatal, telemetry=self.telemetry)
        if self.prometheus is not None:
            self.prometheus.watch(self.master.cluster_view)
        self.api_servicer = ApiServicer(self.master, self.pool, self.guard, self.master_logs)
        api = SyncAdapter(self.api_servicer, self.pool)
        self.http: HttpServer | None = None
        self.http_port = config.http_port
        trial = SyncAdapter(TrialServicer(self.master), self.pool)
        server = GenericOnly(self.server)
        api_pb2_grpc.add_ApiServicer_to_server(api, server)  # type: ignore[arg-type]
        trial_pb2_grpc.add_TrialServiceServicer_to_server(trial, server)  # type: ignore[arg-type]
        agent_pb2_grpc.add_AgentServiceServicer_to_server(
            AgentServicer(self.master, self.pool), server
        )
        self._stopped = threading.Event()

    def _allocation_ok(self, token: str) -> bool:
        master = getattr(self, "master", None)
        return master is not None and token in master.tokens

    def _metrics_setup(self, config: MasterConfig) -> tuple[PrometheusTelemetry | None, str | None]:
        """The counters /metrics shows (None when `metrics` is off), and the token a
        scrape presents (None: none asked). A failure stops what `__init__` started."""
        if config.metrics == "off":
            return None, None
        try:
            # Prometheus's code is loaded only by a master that serves metrics.
            from assay.master.telemetry.prometheus import PrometheusTelemetry

            token = config.metrics_token
            if config.metrics != "token":
                token = None
            elif token is not None:
                check_join_token(token, "metrics_token")
            else:
                token = self.store.secret("metrics_token").hex()
                _write_private(config.state_dir / "metrics-token", token + "\n")
            return PrometheusTelemetry(), token
        except BaseException:
            self._unwind()
            raise

    def _scrape(self) -> tuple[bytes, str]:
        assert self.prometheus is not None
        return self.prometheus.render(), self.prometheus.content_type

    @staticmethod
    def _bind(
        config: MasterConfig,
        interceptors: list[grpc.aio.ServerInterceptor],
        tls: ServerTls | None,
    ) -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server(
            interceptors=interceptors,
            options=[
                ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
                ("grpc.max_send_message_length", MAX_SEND_BYTES),
                ("grpc.so_reuseport", 0),
            ],
        )
        address = f"{config.host}:{config.grpc_port}"
        try:
            if tls is None:
                port = server.add_insecure_port(address)
            else:
                port = server.add_secure_port(address, tls.grpc_credentials())
        except RuntimeError:
            port = 0
        return server, port

    def start(self) -> None:
        self.owner.watch(self._on_fatal)
        self.loop.call(self.server.start)
        config = self.config
        try:
            self.http = self.loop.call(self._serve_http)
        except BaseException:
            self.stop(grace=0)
            raise
        self.http_port = self.http.port
        log.info(
            "assay-master listening on %s:%d (gRPC) and :%d (HTTP, web UI), %s (store: %s)",
            config.host,
            self.port,
            self.http_port,
            f"TLS with {self.tls.cert_file}" if self.tls else "without TLS",
            self.store.engine.url.render_as_string(hide_password=True),
        )

    async def _serve_http(self) -> HttpServer:
        config = self.config
        http = HttpServer(
            self.api_servicer,
            self.pool,
            config.host,
            config.http_port,
            self.guard,
            grpc_port=self.port,
            metrics=self._scrape if self.prometheus is not None else None,
            idle_timeout_s=config.http_idle_timeout_s,
        )
        await http.start(self.tls.ssl_context if self.tls else None)
        return http

    def stop(self, grace: float = 2.0) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.master.close_streams()
        if self.http is not None:
            http = self.http
            with contextlib.suppress(Exception):
                self.loop.call(http.stop, timeout=grace + 10)
        with contextlib.suppress(Exception):
            self.loop.call(lambda: self.server.stop(grace), timeout=grace + 10)
        self.loop.stop()
        self.master.close()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.store.close()
        self.owner.release()
        self.master_logs.close()

    def wait(self) -> None:
        """Serve until stopped; raise if the store failed under the master."""
        self._stopped.wait()
        if isinstance(self.fatal, StoreTakenError):
            raise self.fatal
        if self.fatal is not None:
            raise AssayError(
                f"the master stopped: it could not write to its database ({self.fatal}); "
                "start it again once the database is back, and it resumes from there"
            )

    def _unwind(self) -> None:
        """Undo a start that failed half-way: the loop, the store and its lock."""
        self.loop.stop()
        self.store.close()
        self.owner.release()
        self.master_logs.close()

    def _on_fatal(self, error: BaseException) -> None:
        # Memory is ahead of the database: serving on would act on unrecorded state.
        self.fatal = error
        threading.Thread(target=self.stop, args=(0,), daemon=True).start()


def _open_store(url: str) -> Store:
    """Open (and migrate) the store, with one clear error for a bad or unreachable URL."""
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError

    shown = url.split("@")[-1] if "@" in url else url
    try:
        return Store.open(url)
    except (ArgumentError, NoSuchModuleError) as e:
        raise AssayError(
            f"--db-url {shown!r} is not a database URL Assay can use ({e}); use "
            "sqlite:///PATH or postgresql+psycopg://USER@HOST:PORT/DB"
        ) from None
    except OperationalError as e:
        reason = str(e.orig).strip().splitlines()[0] if e.orig else str(e)
        raise AssayError(f"cannot open the store at {shown}: {reason}") from None


def _with_port(config: MasterConfig, port: int) -> MasterConfig:
    from dataclasses import replace

    return replace(config, grpc_port=port)


def _make_state_dir(state_dir: Path, checkpoint_root: Path) -> None:
    """The state directory and the default checkpoint root inside it, both 0711.

    The store, the join token and every other file the master writes here are its alone
    (0600: main sets the umask 077, and any file found open to others is closed here). The
    directories are 0711, not 0700, so that isolated trials, each running as a uid of its
    own, can pass through them to their experiment's directory `checkpoints/<id>`, which
    their agent gives to the experiment's group alone (2770); they can list neither.
    """
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    checkpoint_root.mkdir(exist_ok=True, mode=0o700)
    state_dir.chmod(0o711)
    checkpoint_root.chmod(0o711)
    for path in state_dir.iterdir():
        mode = path.lstat().st_mode
        if stat.S_ISREG(mode) and mode & 0o077:
            log.warning("%s was open to other users (%o); now only the master's", path, mode)
            path.chmod(0o600)
    where = state_dir.resolve()
    closed = [p for p in (where, *where.parents) if not p.stat().st_mode & 0o001]
    if closed:
        log.info(
            "%s is not traversable by other users: trials isolated by their agent (isolation: "
            "uid) cannot reach the checkpoint root %s; give such experiments a "
            "checkpoint_storage.host_path, or move state_dir",
            closed[0],
            checkpoint_root,
        )


def _write_private(path: Path, text: str) -> None:
    """Write a file only its owner may read (0600 before a byte is written)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
