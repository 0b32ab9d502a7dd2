"""Determined's Trainer API MNIST tutorial as Determined writes it, ported to Assay.

The changes from Determined's `train.py` are the imports (`import assay as det`, `from
assay import pytorch`) and the data (scikit-learn's bundled 8x8 digits, no download).

    python3 train.py                                      # local: one epoch
    assay trial run-local const.yaml .                    # as a cluster slot would run it
    assay experiment create const.yaml .                  # on a cluster
"""

from __future__ import annotations

import logging
from typing import Any

from mnist_trial import MNistTrial

import assay as det
from assay import pytorch

HPARAMS = {
    "global_batch_size": 32,
    "learning_rate": 1.0,
    "gamma": 0.7,
    "n_filters1": 8,
    "n_filters2": 16,
    "dropout1": 0.25,
    "dropout2": 0.5,
}


def run(max_length: pytorch.TrainUnit | None, local: bool = False) -> None:
    info = det.get_cluster_info()
    if local:
        hparams: dict[str, Any] = dict(HPARAMS)
        latest_checkpoint = None
    else:
        assert info is not None
        hparams = info.trial.hparams
        latest_checkpoint = info.latest_checkpoint
    # Off the cluster, init() takes the hyperparameters (global_batch_size included); on a
    # cluster and under run-local they come from the experiment.
    with pytorch.init(hparams=hparams if local else None) as train_context:
        trial = MNistTrial(train_context, hparams=hparams)
        trainer = pytorch.Trainer(trial, train_context)
        trainer.fit(
            max_length=max_length,
            latest_checkpoint=latest_checkpoint,
            validation_period=pytorch.Batch(20),
        )


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    local_training = det.get_cluster_info() is None
    # On a cluster (and under run-local) the searcher's max_length decides.
    run(pytorch.Epoch(1) if local_training else None, local=local_training)
