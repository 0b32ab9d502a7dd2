"""A hand-written PyTorch loop on Assay through the Core API: DDP, metrics, checkpoints,
preemption and hyperparameters, on scikit-learn's bundled 8x8 digits.

    python3 torch_loop.py                                   # anywhere, one process
    assay trial run-local torch_loop.yaml . --slots 2      # two processes, DDP (gloo)
    assay experiment create torch_loop.yaml .               # on a cluster

Every rank trains on its share of each global batch, so N slots train exactly as one slot
with the whole batch (DDP averages the gradients).
"""

from __future__ import annotations

import logging

import torch
from sklearn.datasets import load_digits
from torch import nn

import assay
import assay.core


def data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    return x[:1500], y[:1500], x[1500:], y[1500:]


def main() -> None:
    info = assay.get_cluster_info()
    hparams = info.trial.hparams if info else {"lr": 0.1, "global_batch_size": 64, "hidden": 32}
    max_length = info.trial.max_length if info else 200
    latest = info.latest_checkpoint if info else None
    # Joins the process group (gloo on CPU, NCCL on GPU) when there are several processes.
    distributed = assay.core.DistributedContext.from_torch_distributed()
    with assay.core.init(distributed=distributed) as core:
        torch.manual_seed(0)
        model: nn.Module = nn.Sequential(
            nn.Linear(64, int(hparams["hidden"])), nn.ReLU(), nn.Linear(int(hparams["hidden"]), 10)
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=float(hparams["lr"]))
        step = 0
        if latest is not None:
            with core.checkpoint.restore_path(latest) as path:
                state = torch.load(path / "state.pt", weights_only=True)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            step = int(state["step"])
        if distributed.size > 1:
            model = nn.parallel.DistributedDataParallel(model)
        x_train, y_train, x_val, y_val = data()
        batch = int(hparams["global_batch_size"])
        per_rank = batch // distributed.size
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(1))
        while step < max_length:
            start = (step * batch) % (len(x_train) - batch)
            mine = order[
                start + distributed.rank * per_rank : start + (distributed.rank + 1) * per_rank
            ]
            loss = nn.functional.cross_entropy(model(x_train[mine]), y_train[mine])
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            step += 1
            if step % 10 == 0:
                losses = core.distributed.gather(loss.item())
                if losses is not None:
                    core.train.report_training_metrics(step, {"loss": sum(losses) / len(losses)})
            if step % 50 == 0 or step == max_length:
                if distributed.is_chief:
                    with torch.no_grad():
                        logits = model(x_val)
                        metrics = {
                            "validation_loss": nn.functional.cross_entropy(logits, y_val).item(),
                            "accuracy": (logits.argmax(1) == y_val).float().mean().item(),
                        }
                    core.train.report_validation_metrics(step, metrics)
                    with core.checkpoint.store_path({"steps_completed": step}) as (path, _):
                        plain = (
                            model.module
                            if isinstance(model, nn.parallel.DistributedDataParallel)
                            else model
                        )
                        torch.save(
                            {
                                "model": plain.state_dict(),
                                "optimizer": optimizer.state_dict(),
                                "step": step,
                            },
                            path / "state.pt",
                        )
                if core.preempt.should_preempt():
                    return


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    main()
