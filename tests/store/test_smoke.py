from __future__ import annotations

from assay.master.store import MetricReport, Store
from tests.store import _seed as seed


def test_round_trip(store: Store) -> None:
    eid = seed.experiment(store, name="e", owner="alice", config={"a": 1}, model_definition=b"x")
    tid = seed.trial(store, eid, request_id="r1", hparams={"lr": 0.1}, seed=1)
    run = seed.start_run(store, tid)
    n = store.report_metrics(
        tid, run, "training", [MetricReport(i, {"loss": 1.0 / (i + 1)}) for i in range(100)]
    )
    assert n == 100
    assert store.report_metrics(tid, run, "training", [MetricReport(5, {"loss": 1.0 / 6})]) == 0
    curve = store.trial_curve(tid, "loss", group="training", max_points=10)
    assert len(curve) == 10
    assert curve[0] == (0, 1.0)
