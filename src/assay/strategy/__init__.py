"""Ways of distributing a model over a trial's slots, one module each, behind `Strategy`.

`ddp` (DistributedDataParallel, the default) replicates the model; `fsdp` (FSDP2) shards
parameters, gradients and optimizer state. One slot uses `SingleDeviceStrategy`, no
wrapper. Trials reach them through `TrialContext.wrap_model`, Core API scripts through
`core_context.setup(model, optimizer)`.
"""

from assay.strategy._base import ReduceOp, Strategy
from assay.strategy._ddp import DDPStrategy
from assay.strategy._fsdp import FSDPStrategy
from assay.strategy._select import make_strategy, strategy_for
from assay.strategy._sharded import (
    load_sharded,
    save_sharded,
    sharded_parts,
    strategy_of,
    to_full_state_dict,
    write_full_state_dicts,
)
from assay.strategy._single import SingleDeviceStrategy

__all__ = [
    "DDPStrategy",
    "FSDPStrategy",
    "ReduceOp",
    "SingleDeviceStrategy",
    "Strategy",
    "load_sharded",
    "make_strategy",
    "save_sharded",
    "sharded_parts",
    "strategy_for",
    "strategy_of",
    "to_full_state_dict",
    "write_full_state_dicts",
]
