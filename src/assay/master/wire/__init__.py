"""The master's values as protobuf messages: store records as the API's messages
(configs and hyperparameters masked of secrets), and the agents' messages to and from
the plain values the fleet and the lifecycles use.
"""

from assay.master.wire._agents import (
    agent_message,
    device_message,
    devices,
    load,
    log_lines,
    master_message,
    pool_messages,
    registration,
    slot_kind,
    slot_type,
)
from assay.master.wire._records import (
    checkpoint,
    config_struct,
    experiment,
    log_line,
    timestamp,
    trial,
)

__all__ = [
    "agent_message",
    "checkpoint",
    "config_struct",
    "device_message",
    "devices",
    "experiment",
    "load",
    "log_line",
    "log_lines",
    "master_message",
    "pool_messages",
    "registration",
    "slot_kind",
    "slot_type",
    "timestamp",
    "trial",
]
