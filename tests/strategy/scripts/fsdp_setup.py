"""A Core API loop distributed with `core.setup` (the experiment's strategy), as a
launched script: every rank trains on its slice of a fixed batch; rank 0 saves the full
weights to the `out` hyperparameter's path."""

from __future__ import annotations

import torch
from torch import nn

import assay
import assay.core


def main() -> None:
    info = assay.get_cluster_info()
    assert info is not None
    hp = info.trial.hparams
    with assay.core.init() as core:
        torch.manual_seed(3)
        plain = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        # Built before setup: setup points it at the sharded parameters.
        sgd = torch.optim.SGD(plain.parameters(), lr=0.05, momentum=0.9)
        model, optimizer = core.setup(plain, sgd)
        x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
        y = x.sum(1, keepdim=True)
        rank, size = core.distributed.rank, core.distributed.size
        mine = slice(rank * 32 // size, (rank + 1) * 32 // size)
        steps = int(hp["steps"])
        for _ in range(steps):
            loss = nn.functional.mse_loss(model(x[mine]), y[mine])
            loss.backward()  # type: ignore[no-untyped-call]
            core.strategy.clip_grad_norm(model.parameters(), float(hp["clip"]))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        mean = core.strategy.all_reduce(loss.detach(), "mean")
        state = core.strategy.model_state_dict(model)
        if rank == 0:
            torch.save(state, hp["out"])
            core.train.report_validation_metrics(
                steps_completed=steps, metrics={"loss": float(mean)}
            )


if __name__ == "__main__":
    main()
