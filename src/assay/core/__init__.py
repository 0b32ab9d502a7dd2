"""The Core API: the primitives any training loop needs to run on Assay.

    import assay.core

    with assay.core.init() as core:
        info = assay.get_cluster_info()          # None for a plain `python train.py`
        hparams = info.trial.hparams if info else {"lr": 0.01}
        ...
        core.train.report_training_metrics(steps_completed=step, metrics={"loss": loss})
        core.train.report_validation_metrics(steps_completed=step, metrics={"acc": acc})
        with core.checkpoint.store_path({"steps_completed": step}) as (path, uuid):
            torch.save(model.state_dict(), path / "model.pt")
        if core.preempt.should_preempt():
            return                                # resumed later from latest_checkpoint

One small context per concern, each with a local twin, so one script runs on a laptop
and on the cluster unchanged: `distributed` (ranks and collectives), `train` (metric
reports), `checkpoint` (store, restore, upload, download, delete), `preempt` (stop at a
checkpoint when asked), `searcher` (the length the searcher asks for). Nothing here
imports torch until a collective runs on several processes.
"""

from assay.core._checkpoint import CheckpointContext
from assay.core._context import Context, init
from assay.core._distributed import DistributedContext
from assay.core._info import ClusterInfo, TrialInfo, get_cluster_info
from assay.core._preempt import PreemptContext, PreemptMode
from assay.core._searcher import SearcherContext, SearcherMode, SearcherOperation
from assay.core._train import TrainContext

__all__ = [
    "CheckpointContext",
    "ClusterInfo",
    "Context",
    "DistributedContext",
    "PreemptContext",
    "PreemptMode",
    "SearcherContext",
    "SearcherMode",
    "SearcherOperation",
    "TrainContext",
    "TrialInfo",
    "get_cluster_info",
    "init",
]
