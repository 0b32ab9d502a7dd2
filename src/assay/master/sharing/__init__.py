"""Sharing the cluster between experiments: the scheduler's limits from the live
experiments, fair-share and priority preemption (`preemption`: which runs stop so that a
waiting trial fits), and live changes of an experiment's priority, weight and max_slots.
"""

from assay.master.sharing import _preemption as preemption
from assay.master.sharing._sharing import (
    fair_share_victims,
    limits,
    not_settable,
    parse_value,
    resource_change,
)

__all__ = [
    "fair_share_victims",
    "limits",
    "not_settable",
    "parse_value",
    "preemption",
    "resource_change",
]
