"""A network of its own for one allocation: loopback only, and a way out to the master.

With `isolation_network: loopback` an isolated allocation whose ranks are all on this
agent runs in a network namespace that holds nothing but its own loopback interface.
What listens on the agent's loopback (a database that trusts local connections, the
agent's own services, another trial's rendezvous port) is out of its reach: in its
namespace, 127.0.0.1 is its own. Its ranks still meet each other there (the
torch.distributed rendezvous, Gloo and NCCL's bootstrap run on its loopback), and
reach the master through a relay: the agent, which belongs to both namespaces, listens
on a port of the allocation's loopback and passes each connection on to the master's
trial API. A trial that checkpoints to S3 reaches its endpoint (and nothing else)
through an HTTP proxy the agent runs the same way (`HTTP_PROXY`, `HTTPS_PROXY`: boto3
follows them). Nothing else leaves the namespace: no address of the machine's, no
name server, no other host.

How: a short-lived thread of the agent unshares its network namespace (namespaces are
per thread), brings its loopback up, opens the relay's listening sockets there and
keeps a descriptor of the namespace; the ranks' exec wrapper joins it by that
descriptor (`setns`) while it is still root, before it becomes the allocation's user.
The namespace lives as long as a descriptor or a process holds it; `close` drops the
agent's, and the kernel frees it with the allocation's last process.

A trial spread over several agents needs the machines' network between its ranks (the
rendezvous, and Gloo's and NCCL's connections on ports chosen at run time), so it
cannot run in a namespace of its own: an agent with `isolation_network: loopback`
refuses it, and saying so is the scheduler's and the user's cue to keep such trials on
agents whose network is the host's.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import ipaddress
import logging
import os
import re
import socket
import struct
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from assay.common.tls import SERVER_NAME_ENV, ClientTls

log = logging.getLogger("assay.agent")

CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ = "16sH22x"  # struct ifreq: the name, then the flags of the union (40 bytes)
_BUFFER = 64 * 1024
_MAX_HEAD = 16 * 1024  # a proxy request's head
_HEAD_TIMEOUT = 30.0
# Connections open at once through one allocation's relay and proxy: a trial needs a
# few (a gRPC channel per rank, a pool of S3 connections).
_MAX_CONNECTIONS = 64
_REFUSALS_LOGGED = 10


class NamespaceError(OSError):
    """The agent cannot make or enter a network namespace (not root, not Linux)."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise NamespaceError(errno, f"{what}: {os.strerror(errno)}")


def set_namespace(fd: int) -> None:
    """Move the calling thread into the network namespace `fd` names."""
    _check(_libc().setns(fd, CLONE_NEWNET), "setns")


def _bring_up_loopback() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack(_IFREQ, b"lo", 0)
        flags = struct.unpack(_IFREQ, fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))


@dataclass(frozen=True)
class _Made:
    fd: int
    listeners: tuple[socket.socket, ...]


def _make(listeners: int) -> _Made:
    """In the calling thread: a new network namespace with loopback up and `listeners`
    listening sockets on it; the thread goes back to its own namespace before returning."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    made: list[socket.socket] = []
    try:
        _check(_libc().unshare(CLONE_NEWNET), "unshare")
        try:
            fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                _bring_up_loopback()
                for _ in range(listeners):
                    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    made.append(listener)
                    listener.bind(("127.0.0.1", 0))
                    listener.listen(64)
            except BaseException:
                for listener in made:
                    listener.close()
                os.close(fd)
                raise
        finally:
            set_namespace(own)
    finally:
        os.close(own)
    return _Made(fd, tuple(made))


def _in_own_thread(work: Callable[[], _Made]) -> _Made:
    """Run `work` in a thread of its own, so that no thread of the agent that lives on
    ever leaves the agent's network namespace, even if going back failed."""
    result: list[_Made] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as e:
            error.append(e)

    thread = threading.Thread(target=run, name="netns-make", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def _copy(source: socket.socket, sink: socket.socket) -> None:
    """Copy `source` to `sink` until `source` ends or either fails, then pass the end on."""
    try:
        while data := source.recv(_BUFFER):
            sink.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


# A host name as DNS spells it (letters, digits, hyphens, dots): nothing that a resolver
# would cut short or read otherwise (a NUL, a space, a percent sign).
_HOST_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*")
# AWS's own S3 endpoints, and buckets under them: s3.amazonaws.com,
# s3.us-east-1.amazonaws.com, s3-us-west-2.amazonaws.com, bucket.s3...amazonaws.com.
_AWS_S3 = re.compile(r"([a-z0-9.-]+\.)?s3([.-][a-z0-9-]+)*\.amazonaws\.com")


def _address_kind(address: str) -> str:
    """loopback, link-local, private or global: which network an address is on."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_private or not ip.is_global:
        return "private"
    return "global"


@dataclass(frozen=True)
class Outlet:
    """A place outside that an allocation's processes may reach through its proxy: `host`
    on `port`, and with `subdomains` any name under `host` too (an S3 bucket addressed
    as `<bucket>.<endpoint>`); AWS's own S3 (`aws`) by its names instead.

    A name is resolved once, by the agent, and the connection goes to that address,
    which must be on the Internet, or on the network the endpoint itself is on (an S3
    server on the agent's loopback or a private network): a name that resolves to the
    machine's loopback or to a link-local address (a cloud's metadata service) leads
    nowhere else."""

    host: str
    port: int
    subdomains: bool = False
    aws: bool = False

    def admits(self, host: str, port: int) -> bool:
        if port != self.port:
            return False
        if self.aws:
            return _AWS_S3.fullmatch(host) is not None
        own = self.host.lower().rstrip(".")
        return host == own or (self.subdomains and host.endswith("." + own))

    def networks(self) -> frozenset[str]:
        """The kinds of address a connection through this outlet may go to."""
        if self.aws:
            return frozenset({"global"})
        try:
            found = {_address_kind(str(a[4][0])) for a in socket.getaddrinfo(self.host, self.port)}
        except (OSError, ValueError):
            found = set()
        return frozenset({"global", *found})


def outlet_of_url(url: str | None) -> Outlet:
    """Where an S3 client with `endpoint_url` `url` connects (None: AWS itself)."""
    if not url:
        return Outlet("amazonaws.com", 443, aws=True)
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return Outlet((parts.hostname or "").lower().rstrip("."), port, subdomains=True)


def _host_of(text: str) -> str:
    """A host as a proxy request names it, checked: a DNS name or an IP address; else
    ValueError."""
    host = text.strip("[]").lower().rstrip(".")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    if len(host) > 253 or _HOST_NAME.fullmatch(host) is None:
        raise ValueError(f"not a host name: {text!r}")
    return host


def outlets_of(config: Any) -> list[Outlet]:
    """What an experiment's trials reach outside: its S3 endpoint, if it checkpoints
    there (shared_fs is a directory: nothing to reach)."""
    storage = config.get("checkpoint_storage") if isinstance(config, Mapping) else None
    if isinstance(storage, Mapping) and storage.get("type") == "s3":
        url = storage.get("endpoint_url")
        return [outlet_of_url(url if isinstance(url, str) else None)]
    return []


def split_address(address: str) -> tuple[str, int]:
    """HOST:PORT (or [V6]:PORT) as (host, port); ValueError if it is not one."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{address!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def _read_head(s: socket.socket) -> tuple[bytes, bytes]:
    """An HTTP request's head (to its blank line) and what came after it, all of it
    within `_HEAD_TIMEOUT`."""
    data = b""
    deadline = time.monotonic() + _HEAD_TIMEOUT
    while b"\r\n\r\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or len(data) > _MAX_HEAD:
            raise ValueError("no complete request head")
        s.settimeout(left)
        chunk = s.recv(4096)
        if not chunk:
            raise ValueError("no complete request head")
        data += chunk
    s.settimeout(None)
    head, _, rest = data.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n", rest


def _proxy_target(head: bytes) -> tuple[str, int, bytes | None]:
    """Where a proxy request goes: (host, port, the head to send on), the head None for a
    CONNECT (a tunnel: nothing is sent on, the client speaks TLS through it)."""
    line, _, headers = head.partition(b"\r\n")
    method, target, version = line.decode("latin-1").split(" ")
    if method == "CONNECT":
        named_host, _, named_port = target.rpartition(":")
        return _host_of(named_host), int(named_port), None
    parts = urllib.parse.urlsplit(target)
    if parts.scheme != "http" or not parts.hostname or "@" in parts.netloc:
        raise ValueError(f"not a proxy request: {target}")
    host, port = _host_of(parts.hostname), parts.port or 80
    path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
    # The Host header names where the request goes, whatever the client wrote there (a
    # server behind the endpoint's address must not see another name).
    kept = [h for h in headers.split(b"\r\n") if not h.lower().startswith(b"host:")]
    named = f"Host: {host}" + (f":{port}" if port != 80 else "")
    sent = "\r\n".join([f"{method} {path} {version}", named]).encode("latin-1") + b"\r\n"
    return host, port, sent + b"\r\n".join(kept)


class LoopbackNetwork:
    """One allocation's network namespace, its relay to the master's trial API, and a
    proxy to the `outlets` (its checkpoint storage) when it has any.

    `fd` is the namespace's descriptor for the ranks' wrapper to join; `trial_api` is
    the address the ranks reach the master at from inside (127.0.0.1 and the relay's
    port); `proxy` the HTTP(S) proxy's URL, for `HTTP_PROXY` and `HTTPS_PROXY`, or None.
    Thread-safe; `close` ends the relay, the proxy and every connection through them.
    """

    def __init__(
        self, target: tuple[str, int], outlets: Sequence[Outlet] = (), *, name: str = ""
    ) -> None:
        """`target`: the master's trial API as the agent reaches it (host, port)."""
        try:
            made = _in_own_thread(lambda: _make(2 if outlets else 1))
        except OSError as e:
            raise NamespaceError(
                e.errno,
                f"cannot make a network namespace for the allocation ({e.strerror or e}): "
                "isolation_network: loopback needs an agent running as root on Linux",
            ) from None
        self.fd = made.fd
        self._listeners = made.listeners
        self._target = target
        self._outlets = tuple(outlets)
        self._name = name
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closed = False
        self._slots = threading.BoundedSemaphore(_MAX_CONNECTIONS)
        self._networks: dict[Outlet, frozenset[str]] = {}
        self._refusals = 0
        self.port = _port_of(self._listeners[0])
        self.proxy = f"http://127.0.0.1:{_port_of(self._listeners[1])}" if outlets else None
        self._start(self._listeners[0], self._relay)
        if outlets:
            self._start(self._listeners[1], self._proxy)

    @property
    def trial_api(self) -> str:
        return f"127.0.0.1:{self.port}"

    def environment(self, tls: ClientTls) -> dict[str, str]:
        """What a rank's environment needs inside: the rendezvous on its loopback, the
        proxy for HTTP(S) clients (the trial API's gRPC channel excepted), and, over
        TLS, the master's name to check its certificate against (the rank connects to
        127.0.0.1)."""
        env = {"MASTER_ADDR": "127.0.0.1"}
        if self.proxy is not None:
            # Upper case: Python's HTTP clients (boto3's too) read it, gRPC does not (it
            # reads http_proxy and https_proxy only), so the trial API's channel goes
            # straight to the relay; NO_PROXY names the relay by port, not the whole
            # loopback, since an S3 endpoint may be the agent's 127.0.0.1.
            env.update(HTTP_PROXY=self.proxy, HTTPS_PROXY=self.proxy)
            env["NO_PROXY"] = self.trial_api
            env["no_grpc_proxy"] = "127.0.0.1"
        if tls.enabled and tls.server_name is None:
            env[SERVER_NAME_ENV] = self._target[0]
        return env

    def _start(self, listener: socket.socket, serve: Callable[[socket.socket], None]) -> None:
        """Serve each connection `listener` takes, `_MAX_CONNECTIONS` at most at a time
        (each holds two of the agent's threads): one more is closed at once."""

        def run(inside: socket.socket) -> None:
            try:
                serve(inside)
            finally:
                self._slots.release()

        def accept() -> None:
            while True:
                try:
                    inside, _ = listener.accept()
                except OSError:
                    return  # closed
                if not self._slots.acquire(blocking=False):
                    inside.close()
                    continue
                threading.Thread(
                    target=run, args=(inside,), name=f"relay-{self._name}", daemon=True
                ).start()

        threading.Thread(target=accept, name=f"relay-{self._name}", daemon=True).start()

    def _relay(self, inside: socket.socket) -> None:
        self._join(inside, self._target, b"", b"")

    def _proxy(self, inside: socket.socket) -> None:
        """An HTTP proxy that goes to the outlets only: a CONNECT tunnel (https) or one
        request forwarded (http), refused with 403 for any other place."""
        try:
            head, rest = _read_head(inside)
            host, port, sent = _proxy_target(head)
        except (OSError, ValueError):
            inside.close()
            return
        outlet = next((o for o in self._outlets if o.admits(host, port)), None)
        address = self._resolve(outlet, host, port) if outlet is not None else None
        if address is None:
            self._say_refused(host, port)
            with contextlib.suppress(OSError):
                inside.sendall(_refusal(host, port))
            inside.close()
            return
        if sent is None:
            self._join(inside, address, b"", rest, connected=_TUNNEL_OPEN)
        else:
            self._join(inside, address, sent + rest, b"")

    def _resolve(self, outlet: Outlet, host: str, port: int) -> tuple[str, int] | None:
        """The address to connect to for `host`: its first on a network `outlet` allows
        (see `Outlet`), or None."""
        with self._lock:
            networks = self._networks.get(outlet)
        if networks is None:
            networks = outlet.networks()
            with self._lock:
                self._networks[outlet] = networks
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError:
            return None
        for *_, address in found:
            if _address_kind(str(address[0])) in networks:
                return str(address[0]), port
        return None

    def _say_refused(self, host: str, port: int) -> None:
        """Log a refusal; a trial that keeps asking gets a few lines, not a flood."""
        with self._lock:
            self._refusals += 1
            count = self._refusals
        if count <= _REFUSALS_LOGGED:
            more = " (later refusals are not logged)" if count == _REFUSALS_LOGGED else ""
            log.warning(
                "allocation %s: refused a connection to %s:%d%s", self._name, host, port, more
            )

    def _join(
        self,
        inside: socket.socket,
        target: tuple[str, int],
        first_out: bytes,
        first_in: bytes,
        connected: bytes = b"",
    ) -> None:
        """Connect `inside` with `target`: `first_out` goes out first, `connected` back
        in once connected, `first_in` (read already) out after it; then both ways until
        either ends."""
        try:
            outside = socket.create_connection(target, timeout=10)
            outside.settimeout(None)
            outside.sendall(first_out + first_in)
            if connected:
                inside.sendall(connected)
        except OSError as e:
            log.warning("allocation %s: cannot reach %s:%d: %s", self._name, *target, e)
            inside.close()
            return
        for s in (inside, outside):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            if self._closed:
                inside.close()
                outside.close()
                return
            self._open.update((inside, outside))
        ends = [2]  # the pumps still running; the last one closes both sockets

        def pump(source: socket.socket, sink: socket.socket) -> None:
            _copy(source, sink)
            with self._lock:
                ends[0] -= 1
                last = ends[0] == 0
                if last:
                    self._open.difference_update((inside, outside))
            if last:
                inside.close()
                outside.close()

        threading.Thread(
            target=pump, args=(outside, inside), name=f"relay-{self._name}", daemon=True
        ).start()
        pump(inside, outside)

    def close(self) -> None:
        """Stop relaying and let the namespace go with the allocation's processes."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            sockets = list(self._open)
            self._open.clear()
        for listener in self._listeners:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _port_of(s: socket.socket) -> int:
    return int(s.getsockname()[1])


_TUNNEL_OPEN = b"HTTP/1.1 200 Connection established\r\n\r\n"


def _refusal(host: str, port: int) -> bytes:
    body = (
        f"assay: {host}:{port} is outside this trial's network (isolation_network: "
        "loopback lets a trial reach its master and its checkpoint storage only)\n"
    ).encode()
    head = f"HTTP/1.1 403 Forbidden\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    return head.encode() + body


__all__ = [
    "CLONE_NEWNET",
    "LoopbackNetwork",
    "NamespaceError",
    "Outlet",
    "outlet_of_url",
    "outlets_of",
    "set_namespace",
    "split_address",
]
