"""The NCCL (and Gloo) environment a trial spanning machines needs from its agent.

NCCL picks the network interface for its bootstrap and socket transport itself, and on a
machine with docker bridges, VPN tunnels or several NICs it often picks one the other
machines cannot reach: the job hangs at its first collective. The agent knows the address
the other agents' trial processes reach this machine at (`--address`, or its route to the
master), so it names that address's interface in `NCCL_SOCKET_IFNAME` (and
`GLOO_SOCKET_IFNAME`, for CPU trials). The experiment's `environment_variables` win: a
user who sets `NCCL_SOCKET_IFNAME`, `NCCL_DEBUG=INFO` or any other `NCCL_*` gets exactly
that.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Mapping

import psutil

log = logging.getLogger("assay.agent")

SOCKET_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def interface_of(address: str) -> str | None:
    """The name of this machine's network interface that holds `address` (an IP address,
    or a host name resolved here); None when no interface holds it."""
    try:
        wanted = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        try:
            wanted = ipaddress.ip_address(socket.gethostbyname(address))
        except (OSError, ValueError):
            return None
    for name, addresses in psutil.net_if_addrs().items():
        for entry in addresses:
            if entry.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:
                if ipaddress.ip_address(entry.address.split("%")[0]) == wanted:
                    return str(name)
            except ValueError:
                continue
    return None


def nccl_environment(interface: str | None, configured: Mapping[str, str]) -> dict[str, str]:
    """What the agent adds to a rank's environment: the socket interface variables, unless
    the experiment's `configured` environment variables set them."""
    if interface is None:
        return {}
    return {name: interface for name in SOCKET_VARIABLES if name not in configured}


__all__ = ["SOCKET_VARIABLES", "interface_of", "nccl_environment"]
