"""Which of this machine's GPUs belong together: NVLink islands, else NUMA nodes.

Two GPUs are in one island when NVML says peer-to-peer over NVLink works between them
(`nvmlDeviceGetP2PStatus(..., NVLINK)`); islands are the connected groups. On a machine
without NVLink, GPUs whose nearest common ancestor is at most a NUMA node
(`nvmlDeviceGetTopologyCommonAncestor` <= NODE) share one, so a multi-GPU trial placed on
one island talks over NVLink, or at least without crossing the CPUs' interconnect.
Islands are numbered 0, 1, ... in the order of their lowest GPU index; an NVML that
cannot say (old drivers, virtual GPUs) leaves every GPU in island 0.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

log = logging.getLogger("assay.agent")

# NVML's constants, read from the module when it has them (its values as fallbacks).
_P2P_NVLINK, _P2P_OK, _TOPOLOGY_NODE = 2, 0, 40


def gpu_islands(nvml: Any, indices: Sequence[int]) -> dict[int, int]:
    """Each GPU index's island number."""
    nvlink = getattr(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", _P2P_NVLINK)
    ok = getattr(nvml, "NVML_P2P_STATUS_OK", _P2P_OK)
    node = getattr(nvml, "NVML_TOPOLOGY_NODE", _TOPOLOGY_NODE)
    try:
        handles = {i: nvml.nvmlDeviceGetHandleByIndex(i) for i in indices}

        def nvlinked(a: int, b: int) -> bool:
            return bool(nvml.nvmlDeviceGetP2PStatus(handles[a], handles[b], nvlink) == ok)

        def near(a: int, b: int) -> bool:
            level = nvml.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b])
            return bool(int(level) <= node)

        pairs = [(a, b) for n, a in enumerate(indices) for b in indices[n + 1 :]]
        linked = [pair for pair in pairs if nvlinked(*pair)]
        return _components(indices, linked if linked else [p for p in pairs if near(*p)])
    except Exception as e:  # NVMLError_NotSupported, a binding without these calls, ...
        log.info("GPU topology unknown (%s): every GPU in island 0", e)
        return dict.fromkeys(indices, 0)


def _components(indices: Sequence[int], edges: Sequence[tuple[int, int]]) -> dict[int, int]:
    parent = {i: i for i in indices}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in edges:
        parent[root(a)] = root(b)
    numbers: dict[int, int] = {}
    out = {}
    for i in sorted(indices):
        out[i] = numbers.setdefault(root(i), len(numbers))
    return out


__all__ = ["gpu_islands"]
