"""The NCCL environment the agent gives a trial: the socket interface of the address it
advertises, unless the experiment's environment_variables (or the agent's own) set it;
NCCL_DEBUG and other NCCL_* variables pass through from the config."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import psutil
import pytest

from assay.agent import Agent
from assay.agent._nccl import interface_of, nccl_environment
from tests.agent.conftest import FakeMaster, model_tarball, start_message

RunAgent = Callable[..., Agent]

WORKER = """
import json, os
keys = [k for k in os.environ if k.startswith(("NCCL_", "GLOO_"))]
print("REPORT " + json.dumps({k: os.environ[k] for k in keys}))
"""


def loopback_name() -> str:
    return str(
        next(
            name
            for name, addresses in psutil.net_if_addrs().items()
            if any(a.address == "127.0.0.1" for a in addresses)
        )
    )


def test_the_interface_holding_an_address_is_found() -> None:
    assert interface_of("127.0.0.1") == loopback_name()
    assert interface_of("localhost") == loopback_name()
    assert interface_of("192.0.2.77") is None  # TEST-NET-1: on no interface here
    assert interface_of("no-such-host.invalid") is None


def test_configured_variables_win() -> None:
    both = {"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0"}
    assert nccl_environment("lo", {}) == {"NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"}
    assert nccl_environment("lo", {"NCCL_SOCKET_IFNAME": "ib0"}) == {"GLOO_SOCKET_IFNAME": "lo"}
    assert nccl_environment("lo", both) == {}
    assert nccl_environment(None, {}) == {}


def _env_of(master: FakeMaster, allocation_id: str, config: dict[str, Any]) -> dict[str, str]:
    message = start_message(
        allocation_id, {}, slots=[0], model=model_tarball({"worker.py": WORKER})
    )
    message.start.config_json = json.dumps(config)
    master.send(message)
    master.exited(allocation_id)
    for line in master.lines(allocation_id):
        if line.message.startswith("REPORT "):
            found: dict[str, str] = json.loads(line.message.removeprefix("REPORT "))
            return found
    raise AssertionError(f"no REPORT line from {allocation_id}")


@pytest.fixture(autouse=True)
def _no_inherited_nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("NCCL_", "GLOO_")):
            monkeypatch.delenv(name)


def test_a_rank_gets_the_interface_and_the_configs_nccl_variables(
    master: FakeMaster, run_agent: RunAgent
) -> None:
    run_agent()  # advertises 127.0.0.1
    master.wait_for("register")
    lo = loopback_name()
    assert _env_of(master, "a1", {"name": "n"}) == {
        "NCCL_SOCKET_IFNAME": lo,
        "GLOO_SOCKET_IFNAME": lo,
    }
    variables = {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "ib0", "NCCL_IB_DISABLE": "1"}
    config = {"name": "n", "environment": {"environment_variables": variables}}
    assert _env_of(master, "a2", config) == {**variables, "GLOO_SOCKET_IFNAME": lo}


def test_an_address_on_no_interface_sets_nothing(master: FakeMaster, run_agent: RunAgent) -> None:
    run_agent(address="192.0.2.77")
    master.wait_for("register")
    assert _env_of(master, "a1", {"name": "n"}) == {}
