"""Metric ingest and curve-read cost of the experiment store, on SQLite and PostgreSQL.

1. Ingest. `Store.report_metrics(trial, run, "training", reports)` is timed in batches of
   1,000 rows: 500 reports of 2 metrics each ("loss" and "lr"), consecutive batch counts.
   Against it, the same 1,000 rows (same shape, other trial id) go into the same `metrics`
   table through SQLAlchemy Core, one `connection.execute(insert(metrics), rows)`
   executemany per transaction. The raw path does no idempotence check (the store first
   reads what is stored in the batch's range), no fencing (the store reads the trial's run
   id) and no rollup maintenance (the store upserts a min/max/first/last summary per bucket
   and level) -- that is the point of the comparison: what the store's guarantees cost.
   Rounds are interleaved A/B (the order flips every round); each side's rows/s is the
   median over rounds, and the ratio is store/raw. The inputs of both sides (the
   `MetricReport` list, the list of dicts) are built before the clock starts.
   Targets: store/raw >= 0.7 on both engines, store >= 20,000 rows/s on SQLite.
   Context: MLflow's SQLAlchemy tracking store logged ~110 metric rows/s one call per value
   and ~7,700 rows/s through `log_batch` (as measured by its users on SQLite).

2. Curve read. One trial gets 1,000,000 rows of one metric (total_batches 1..1,000,000;
   200,000 with --quick), reported through the store in batches of 10,000 rows so that
   the rollups are built as in production; that setup is timed and reported. The values
   are a noisy decaying curve with one known spike (the global max) and one known dip (the
   global min). Then `Store.trial_curve(trial, "loss", group="training", max_points=1000)`
   is timed (median of several calls after one warm-up call). Target: <= 100 ms on both
   engines. The curve is checked: at most 1,000 points, strictly sorted by batch, and it
   contains the global min and max points exactly.

3. Experiment read, as the web UI's experiment page asks for it: 100 trials of 10,000
   rows each (consecutive batch counts, reported through the store in batches of 5,000,
   each trial with its own known spike and dip); setup is timed and reported. Then
   `Store.experiment_curves(experiment, "loss", group="training", max_points=N)` for N =
   500 and 1,000 is timed (median of several calls after one warm-up call). Target:
   <= 300 ms on both engines, so that the page draws within 1.5 s. Every curve is
   checked as in 2. Context: this read took 3.0-3.5 s when curves of up to 20,000 rows
   were read raw and thinned by a pure-Python LTTB.

PostgreSQL is the server at ASSAY_BENCH_POSTGRES (else ASSAY_TEST_POSTGRES, else
postgres@127.0.0.1:5432 with trust auth); the benchmark creates its own database
`assay_bench_<random>` and drops it at the end, also on error. SQLite is a temporary file
(WAL, as the store configures it).

    python bench/metrics_ingest.py [--quick] [--engines sqlite,postgresql]

Human-readable lines first; the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import itertools
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, insert, text

from assay.master.store import Metric, MetricReport, Store, WriteBatch
from assay.master.store._engine import writer

RATIO_TARGET = 0.7
SQLITE_ROWS_TARGET = 20_000.0
CURVE_MS_TARGET = 100.0
EXPERIMENT_MS_TARGET = 300.0
EXPERIMENT_TRIALS = 100
EXPERIMENT_ROWS = 10_000
EXPERIMENT_BATCH_ROWS = 5_000
EXPERIMENT_MAX_POINTS = (500, 1_000)
GROUP = "training"
BATCH_ROWS = 1_000
METRICS_PER_REPORT = 2  # "loss" and "lr": 500 reports x 2 metrics = 1,000 rows per batch
CURVE_BATCH_ROWS = 10_000
MAX_POINTS = 1_000
ENGINES = ("sqlite", "postgresql")
SERVER = os.environ.get(
    "ASSAY_BENCH_POSTGRES",
    os.environ.get("ASSAY_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432"),
)


@dataclass(frozen=True)
class Settings:
    rounds: int  # interleaved A/B rounds
    batches_per_round: int  # 1,000-row batches per side per round
    warmup_batches: int  # untimed batches per side before the first round
    curve_rows: int
    curve_calls: int  # timed trial_curve calls (after one untimed warm-up call)
    experiment_calls: int  # timed experiment_curves calls per max_points (after a warm-up)


FULL = Settings(
    rounds=15,
    batches_per_round=5,
    warmup_batches=5,
    curve_rows=1_000_000,
    curve_calls=9,
    experiment_calls=7,
)
QUICK = Settings(
    rounds=9,
    batches_per_round=3,
    warmup_batches=3,
    curve_rows=200_000,
    curve_calls=5,
    experiment_calls=3,
)


@dataclass
class EngineResult:
    engine: str
    store_rows_per_s: float = 0.0
    raw_rows_per_s: float = 0.0
    ratio: float = 0.0
    store_rounds: list[float] = field(default_factory=list)
    raw_rounds: list[float] = field(default_factory=list)
    curve_setup_s: float = 0.0
    curve_setup_rows_per_s: float = 0.0
    curve_ms: float = 0.0
    curve_first_ms: float = 0.0
    curve_points: int = 0
    curve_sorted: bool = False
    extremes_kept: bool = False
    curve_within_max_points: bool = False
    experiment_setup_s: float = 0.0
    experiment_ms: dict[int, float] = field(default_factory=dict)  # max_points -> median
    experiment_points: dict[int, int] = field(default_factory=dict)  # max_points -> total
    experiment_curves_ok: bool = False

    def curve_ok(self) -> bool:
        return self.curve_sorted and self.extremes_kept and self.curve_within_max_points


# --- databases -----------------------------------------------------------------------------


@contextmanager
def database(engine: str) -> Iterator[str]:
    """A URL to a fresh, empty database of `engine`, removed afterwards (also on error)."""
    if engine == "sqlite":
        with tempfile.TemporaryDirectory(prefix="assay-bench-") as folder:
            yield f"sqlite:///{Path(folder) / 'assay.db'}"
        return
    name = f"assay_bench_{uuid.uuid4().hex[:12]}"
    admin = create_engine(f"{SERVER}/postgres", isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield f"{SERVER}/{name}"
        finally:
            with admin.connect() as c:
                c.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = :n AND pid <> pg_backend_pid()"
                    ),
                    {"n": name},
                )
                c.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
    finally:
        admin.dispose()


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def new_experiment(store: Store, name: str) -> int:
    """A fresh experiment, written as the master writes one (a `WriteBatch`)."""
    experiment_id = store.reserve_id("experiments")
    batch = WriteBatch()
    batch.add_experiment(
        experiment_id,
        name=name,
        owner_id=store.user_id("bench"),
        config={},
        model_definition=b"",
        state="ACTIVE",
        description="",
        labels=(),
        priority=42,
        now=_now(),
    )
    store.apply(batch)
    return experiment_id


def new_trial(store: Store, experiment_id: int, request_id: str) -> tuple[int, int]:
    """A fresh trial on its first run, and that run's id."""
    trial_id = store.reserve_id("trials")
    batch = WriteBatch()
    batch.add_trial(
        trial_id,
        experiment_id=experiment_id,
        request_id=request_id,
        hparams={},
        seed=0,
        state="RUNNING",
        now=_now(),
    )
    batch.set_trial(trial_id, run_id=1, start_time=_now())
    store.apply(batch)
    return trial_id, 1


# --- data ----------------------------------------------------------------------------------


def loss_at(batches: int, rng: random.Random) -> float:
    return 2.0 * math.exp(-batches / 200_000) + 0.1 + rng.gauss(0.0, 0.02)


def ingest_reports(start: int, rng: random.Random) -> list[MetricReport]:
    """One store batch: BATCH_ROWS rows as reports of METRICS_PER_REPORT metrics."""
    return [
        MetricReport(b, {"loss": loss_at(b, rng), "lr": 1e-3 / (1 + b / 100_000)})
        for b in range(start, start + BATCH_ROWS // METRICS_PER_REPORT)
    ]


def raw_rows(trial_id: int, run_id: int, reports: list[MetricReport]) -> list[dict[str, Any]]:
    """The same rows as `reports`, shaped as `metrics` rows."""
    return [
        {
            "trial_id": trial_id,
            "run_id": run_id,
            "group": GROUP,
            "name": name,
            "total_batches": r.total_batches,
            "value": value,
            "superseded": False,
        }
        for r in reports
        for name, value in r.values.items()
    ]


# --- ingest --------------------------------------------------------------------------------


def bench_ingest(store: Store, experiment_id: int, s: Settings, result: EngineResult) -> None:
    store_trial, store_run = new_trial(store, experiment_id, "ingest-store")
    raw_trial, raw_run = new_trial(store, experiment_id, "ingest-raw")
    rng = random.Random(1)
    step = BATCH_ROWS // METRICS_PER_REPORT
    batches = s.warmup_batches + s.rounds * s.batches_per_round
    store_batches = [ingest_reports(1 + i * step, rng) for i in range(batches)]
    raw_batches = [raw_rows(raw_trial, raw_run, b) for b in store_batches]
    metrics = Metric.metadata.tables[Metric.__tablename__]  # the Core Table behind Metric
    raw_writer = writer(store.engine)  # same transaction mode (BEGIN IMMEDIATE on SQLite)

    def store_side(chunk: list[list[MetricReport]]) -> float:
        t0 = time.perf_counter()
        for reports in chunk:
            written = store.report_metrics(store_trial, store_run, GROUP, reports)
            assert written == BATCH_ROWS, written
        return time.perf_counter() - t0

    def raw_side(chunk: list[list[dict[str, Any]]]) -> float:
        t0 = time.perf_counter()
        for rows in chunk:
            with raw_writer.begin() as connection:
                connection.execute(insert(metrics), rows)
        return time.perf_counter() - t0

    w = s.warmup_batches
    store_side(store_batches[:w])
    raw_side(raw_batches[:w])
    rows_per_round = s.batches_per_round * BATCH_ROWS
    for i in range(s.rounds):
        lo = w + i * s.batches_per_round
        hi = lo + s.batches_per_round
        gc.collect()
        if i % 2 == 0:
            t_store = store_side(store_batches[lo:hi])
            t_raw = raw_side(raw_batches[lo:hi])
        else:
            t_raw = raw_side(raw_batches[lo:hi])
            t_store = store_side(store_batches[lo:hi])
        result.store_rounds.append(rows_per_round / t_store)
        result.raw_rounds.append(rows_per_round / t_raw)
    result.store_rows_per_s = statistics.median(result.store_rounds)
    result.raw_rows_per_s = statistics.median(result.raw_rounds)
    result.ratio = result.store_rows_per_s / result.raw_rows_per_s


# --- curve ---------------------------------------------------------------------------------


def bench_curve(store: Store, experiment_id: int, s: Settings, result: EngineResult) -> None:
    trial_id, run_id = new_trial(store, experiment_id, "curve")
    n = s.curve_rows
    rng = random.Random(2)
    # Known extremes, away from bucket edges (total_batches run 1..n).
    spike_at, dip_at = int(n * 0.37) + 11, int(n * 0.71) + 5
    spike, dip = 1_000.0, -1_000.0
    t0 = time.perf_counter()
    for start in range(1, n + 1, CURVE_BATCH_ROWS):
        reports = []
        for b in range(start, min(start + CURVE_BATCH_ROWS, n + 1)):
            value = spike if b == spike_at else dip if b == dip_at else loss_at(b, rng)
            reports.append(MetricReport(b, {"loss": value}))
        store.report_metrics(trial_id, run_id, GROUP, reports)
    result.curve_setup_s = time.perf_counter() - t0
    result.curve_setup_rows_per_s = n / result.curve_setup_s

    def read() -> tuple[float, list[tuple[int, float]]]:
        t = time.perf_counter()
        curve = store.trial_curve(trial_id, "loss", group=GROUP, max_points=MAX_POINTS)
        return (time.perf_counter() - t) * 1000, curve

    result.curve_first_ms, curve = read()
    times = []
    for _ in range(s.curve_calls):
        ms, again = read()
        times.append(ms)
        assert again == curve
    result.curve_ms = statistics.median(times)
    xs = [x for x, _ in curve]
    result.curve_points = len(curve)
    result.curve_within_max_points = 0 < len(curve) <= MAX_POINTS
    result.curve_sorted = all(a < b for a, b in itertools.pairwise(xs))
    result.extremes_kept = (spike_at, spike) in curve and (dip_at, dip) in curve


def curve_ok(
    curve: list[tuple[int, float]], max_points: int, kept: list[tuple[int, float]]
) -> bool:
    """At most `max_points` points, strictly sorted by batch, every point of `kept` in it."""
    xs = [x for x, _ in curve]
    return (
        0 < len(curve) <= max_points
        and all(a < b for a, b in itertools.pairwise(xs))
        and all(point in curve for point in kept)
    )


def bench_experiment(store: Store, s: Settings, result: EngineResult) -> None:
    experiment_id = new_experiment(store, "experiment-read")
    rng = random.Random(3)
    extremes: dict[int, list[tuple[int, float]]] = {}
    t0 = time.perf_counter()
    for t in range(EXPERIMENT_TRIALS):
        trial_id, run_id = new_trial(store, experiment_id, f"experiment-{t}")
        spike_at, dip_at = rng.sample(range(1, EXPERIMENT_ROWS + 1), 2)
        spike, dip = 1_000.0 + t, -1_000.0 - t
        reports = [
            MetricReport(
                b, {"loss": spike if b == spike_at else dip if b == dip_at else loss_at(b, rng)}
            )
            for b in range(1, EXPERIMENT_ROWS + 1)
        ]
        for start in range(0, EXPERIMENT_ROWS, EXPERIMENT_BATCH_ROWS):
            chunk = reports[start : start + EXPERIMENT_BATCH_ROWS]
            store.report_metrics(trial_id, run_id, GROUP, chunk)
        extremes[trial_id] = [(spike_at, spike), (dip_at, dip)]
    result.experiment_setup_s = time.perf_counter() - t0

    ok = True
    for max_points in EXPERIMENT_MAX_POINTS:

        def read(points: int = max_points) -> tuple[float, dict[int, list[tuple[int, float]]]]:
            t = time.perf_counter()
            curves = store.experiment_curves(experiment_id, "loss", group=GROUP, max_points=points)
            return (time.perf_counter() - t) * 1000, curves

        _, curves = read()
        times = []
        for _ in range(s.experiment_calls):
            gc.collect()
            ms, again = read()
            times.append(ms)
            assert again == curves
        result.experiment_ms[max_points] = statistics.median(times)
        result.experiment_points[max_points] = sum(len(c) for c in curves.values())
        ok = ok and sorted(curves) == sorted(extremes)
        ok = ok and all(curve_ok(curves[t], max_points, extremes[t]) for t in extremes)
    result.experiment_curves_ok = ok


# --- driver --------------------------------------------------------------------------------


def run_engine(engine: str, s: Settings) -> EngineResult:
    result = EngineResult(engine)
    with database(engine) as url:
        store = Store.open(url)
        try:
            experiment_id = new_experiment(store, "metrics-ingest")
            bench_ingest(store, experiment_id, s, result)
            print(
                f"[{engine}] ingest ({BATCH_ROWS} rows/batch = "
                f"{BATCH_ROWS // METRICS_PER_REPORT} reports x {METRICS_PER_REPORT} metrics, "
                f"{s.rounds} rounds x {s.batches_per_round} batches): "
                f"store {result.store_rows_per_s:,.0f} rows/s, "
                f"raw executemany {result.raw_rows_per_s:,.0f} rows/s, "
                f"store/raw {result.ratio:.3f}",
                flush=True,
            )
            print(
                f"[{engine}]   per round store: "
                + ", ".join(f"{v:,.0f}" for v in result.store_rounds)
                + "\n"
                + f"[{engine}]   per round raw:   "
                + ", ".join(f"{v:,.0f}" for v in result.raw_rounds),
                flush=True,
            )
            bench_curve(store, experiment_id, s, result)
            print(
                f"[{engine}] curve setup: {s.curve_rows:,} rows through report_metrics in "
                f"batches of {CURVE_BATCH_ROWS:,}: {result.curve_setup_s:.1f} s "
                f"({result.curve_setup_rows_per_s:,.0f} rows/s)",
                flush=True,
            )
            print(
                f"[{engine}] trial_curve(max_points={MAX_POINTS}): median "
                f"{result.curve_ms:.1f} ms over {s.curve_calls} calls (first call "
                f"{result.curve_first_ms:.1f} ms); {result.curve_points} points, sorted="
                f"{result.curve_sorted}, extremes kept={result.extremes_kept}",
                flush=True,
            )
            bench_experiment(store, s, result)
            print(
                f"[{engine}] experiment setup: {EXPERIMENT_TRIALS} trials x "
                f"{EXPERIMENT_ROWS:,} rows through report_metrics in batches of "
                f"{EXPERIMENT_BATCH_ROWS:,}: {result.experiment_setup_s:.1f} s",
                flush=True,
            )
            for max_points, ms in result.experiment_ms.items():
                print(
                    f"[{engine}] experiment_curves(max_points={max_points}): median "
                    f"{ms:.1f} ms over {s.experiment_calls} calls; "
                    f"{result.experiment_points[max_points]:,} points in all, every curve "
                    f"sorted with its extremes: {result.experiment_curves_ok}",
                    flush=True,
                )
        finally:
            store.close()
    return result


def summary(results: list[EngineResult], s: Settings, quick: bool, wall_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {
        "benchmark": "metrics_ingest",
        "quick": quick,
        "ratio": round(min(r.ratio for r in results), 4),
        "target": RATIO_TARGET,
        "sqlite_rows_target": SQLITE_ROWS_TARGET,
        "curve_ms_target": CURVE_MS_TARGET,
        "experiment_ms_target": EXPERIMENT_MS_TARGET,
        "experiment_shape": f"{EXPERIMENT_TRIALS} trials x {EXPERIMENT_ROWS} rows",
        "batch_rows": BATCH_ROWS,
        "batch_shape": f"{BATCH_ROWS // METRICS_PER_REPORT} reports x {METRICS_PER_REPORT} metrics",
        "rounds": s.rounds,
        "batches_per_round": s.batches_per_round,
        "curve_rows": s.curve_rows,
        "curve_batch_rows": CURVE_BATCH_ROWS,
        "curve_max_points": MAX_POINTS,
        "engines": [r.engine for r in results],
    }
    for name in ENGINES:
        for key in (
            "store_rows_per_s",
            "raw_rows_per_s",
            "ratio",
            "curve_ms",
            "curve_first_ms",
            "curve_setup_s",
            "experiment_setup_s",
        ):
            out[f"{name}_{key}"] = None
        for max_points in EXPERIMENT_MAX_POINTS:
            out[f"{name}_experiment_{max_points}_ms"] = None
    passed = True
    for r in results:
        p = r.engine
        out[f"{p}_store_rows_per_s"] = round(r.store_rows_per_s, 1)
        out[f"{p}_raw_rows_per_s"] = round(r.raw_rows_per_s, 1)
        out[f"{p}_ratio"] = round(r.ratio, 4)
        out[f"{p}_curve_ms"] = round(r.curve_ms, 2)
        out[f"{p}_curve_first_ms"] = round(r.curve_first_ms, 2)
        out[f"{p}_curve_setup_s"] = round(r.curve_setup_s, 2)
        out[f"{p}_curve_points"] = r.curve_points
        out[f"{p}_experiment_setup_s"] = round(r.experiment_setup_s, 2)
        for max_points, ms in r.experiment_ms.items():
            out[f"{p}_experiment_{max_points}_ms"] = round(ms, 2)
        passed = passed and r.ratio >= RATIO_TARGET and r.curve_ms <= CURVE_MS_TARGET
        passed = passed and r.curve_ok() and r.experiment_curves_ok
        passed = passed and max(r.experiment_ms.values()) <= EXPERIMENT_MS_TARGET
        if r.engine == "sqlite":
            passed = passed and r.store_rows_per_s >= SQLITE_ROWS_TARGET
    out["curve_points"] = max(r.curve_points for r in results)
    out["curve_sorted"] = all(r.curve_sorted for r in results)
    out["extremes_kept"] = all(r.extremes_kept for r in results)
    out["curve_within_max_points"] = all(r.curve_within_max_points for r in results)
    out["experiment_curves_ok"] = all(r.experiment_curves_ok for r in results)
    out["curve_setup_s"] = round(sum(r.curve_setup_s for r in results), 2)
    out["wall_s"] = round(wall_s, 1)
    out["passed"] = passed
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--quick", action="store_true", help="fewer rounds, 200,000-row curve (about 1 min)"
    )
    parser.add_argument(
        "--engines",
        default=",".join(ENGINES),
        help="comma-separated subset of: sqlite,postgresql",
    )
    args = parser.parse_args(argv)
    engines = [e.strip() for e in str(args.engines).split(",") if e.strip()]
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown or not engines:
        parser.error(f"unknown engines {unknown}; choose from {','.join(ENGINES)}")
    s = QUICK if args.quick else FULL
    t0 = time.perf_counter()
    results = [run_engine(engine, s) for engine in engines]
    out = summary(results, s, bool(args.quick), time.perf_counter() - t0)
    print(
        f"store/raw (worse engine) {out['ratio']:.3f} (target >= {RATIO_TARGET}); "
        f"passed={out['passed']}"
    )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
