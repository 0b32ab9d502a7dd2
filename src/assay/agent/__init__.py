"""The Assay agent daemon (`assay-agent`): devices, the master connection, harness launches.

from assay.agent import Agent, AgentSettings
Agent(AgentSettings(master="127.0.0.1:8090")).run()
"""

from assay.agent._agent import Agent
from assay.agent._config import AgentSettings
from assay.agent._connection import Backoff
from assay.agent._devices import DeviceInfo, NoGPUError, detect_devices

__all__ = [
    "Agent",
    "AgentSettings",
    "Backoff",
    "DeviceInfo",
    "NoGPUError",
    "detect_devices",
]
