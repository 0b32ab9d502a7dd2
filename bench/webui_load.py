"""Time from navigation to drawn learning curves on the web UI's experiment page.

An experiment with 100 trials of 10,000 training-loss rows each (plus a validation
accuracy every 100 batches) is written straight into a SQLite store as the master writes
it: its rows through `WriteBatch`es, its reports through `Store.report_metrics` (rollups
included). An `assay-master` process serves that store and the built web UI; headless
Chromium (Debian's, driven by Playwright) opens `/experiments/{id}` in a fresh browser
context each round, and the page records `window.__assayCurvesDrawnAt`
(performance.now(), i.e. milliseconds since navigation began) when uPlot has drawn every
trial's curve.

Baseline, in the same round: a blank page of the same origin fetches exactly the API
requests the page made before its curves arrived (recorded from the page in the warm-up
round: the session, the master, the experiment and its curves with the page's
`max_points`) with `fetch` + `JSON.parse`, all at once and nothing else, timed the same
way. The ratio (page / baseline) is what rendering and the app cost on top of moving the
data. Rounds alternate the order of the two. Target: the curves drawn within 1.5 s
(MLflow's and Determined's UIs are known to lag at this size).

    python bench/webui_load.py [--quick] [--rounds N]
    python bench/webui_load.py --serve [--port 8080] [--trials 20] [--rows 2000]

`--serve` seeds a store with a few experiments (one large, one failed) and runs a master
on it until Ctrl-C, with a real CPU agent and two experiments of the digits example
submitted through the CLI (one paused, one running), for developing the
UI (`cd webui && npm run dev` proxies /api to it). The web UI must be built first
(`cd webui && npm ci && npm run build`). Human-readable lines first; the last line printed
is one JSON object.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import random
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from assay._rank_processes import free_port
from assay.master.api import DEFAULT_UI_DIR
from assay.master.store import CheckpointRecord, LogLine, MetricReport, Store, WriteBatch

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 1.5
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

CONFIG = {
    "name": "digits-asha",
    "description": "adaptive ASHA over the digits CNN",
    "labels": ["digits", "bench"],
    "entrypoint": "model_def:DigitsTrial",
    "hyperparameters": {
        "global_batch_size": 32,
        "lr": {"type": "log", "minval": -4, "maxval": -1.5, "base": 10},
        "n_filters": {"type": "int", "minval": 4, "maxval": 32},
        "dropout": {"type": "double", "minval": 0.0, "maxval": 0.5},
    },
    "records_per_epoch": 1280,
    "searcher": {
        "name": "adaptive_asha",
        "metric": "accuracy",
        "smaller_is_better": False,
        "max_length": {"batches": 10000},
        "max_trials": 100,
        "max_concurrent_trials": 8,
    },
}


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def seed_experiment(
    store: Store,
    *,
    trials: int,
    rows: int,
    name: str = "digits-asha",
    state: str = "COMPLETED",
    seed: int = 0,
    logs: int = 50,
) -> int:
    """Write an experiment with `trials` trials of `rows` training-loss rows each (and a
    validation accuracy every 100 batches, a checkpoint at the end, `logs` log lines);
    return its id. Values form decaying noisy curves whose level depends on the hparams."""
    rng = random.Random(seed)
    config = dict(CONFIG, name=name)
    # Written as the master writes: rows in a WriteBatch, one transaction per batch.
    experiment_id = store.reserve_id("experiments")
    batch = WriteBatch()
    batch.add_experiment(
        experiment_id,
        name=name,
        owner_id=store.user_id("admin"),
        config=config,
        model_definition=b"",
        state=state,
        description=str(config["description"]),
        labels=list(config["labels"]),  # type: ignore[call-overload]
        priority=42,
        now=_now(),
    )
    store.apply(batch)
    validation_every = max(1, min(100, rows // 10))
    for t in range(trials):
        lr = 10 ** rng.uniform(-4, -1.5)
        hparams = {
            "global_batch_size": 32,
            "lr": lr,
            "n_filters": rng.randint(4, 32),
            "dropout": round(rng.uniform(0.0, 0.5), 3),
        }
        trial_id, run_id = store.reserve_id("trials"), 1
        batch = WriteBatch()
        batch.add_trial(
            trial_id,
            experiment_id=experiment_id,
            request_id=f"seed-{t}",
            hparams=hparams,
            seed=rng.randrange(2**31),
            state="RUNNING",
            now=_now(),
        )
        batch.set_trial(trial_id, run_id=run_id)
        store.apply(batch)
        quality = 1.0 - abs(math.log10(lr) + 2.5) / 2.0  # best near lr = 10^-2.5
        floor = 0.05 + 0.4 * (1 - quality) + 0.1 * hparams["dropout"]
        reports: list[MetricReport] = []
        for b in range(1, rows + 1):
            loss = floor + 2.3 * math.exp(-b / (rows / 6)) + rng.gauss(0, 0.03)
            reports.append(MetricReport(b, {"loss": loss}))
            if len(reports) == 5000:
                store.report_metrics(trial_id, run_id, "training", reports)
                reports = []
        if reports:
            store.report_metrics(trial_id, run_id, "training", reports)
        validations = [
            MetricReport(
                b,
                {
                    "accuracy": min(0.999, 1 - floor - 0.5 * math.exp(-b / (rows / 5))),
                    "validation_loss": floor + 1.5 * math.exp(-b / (rows / 5)),
                },
            )
            for b in range(validation_every, rows + 1, validation_every)
        ]
        store.report_metrics(trial_id, run_id, "validation", validations)
        best = max((r.values["accuracy"] or 0.0) for r in validations) if validations else None
        checkpoint = str(uuid.UUID(int=rng.getrandbits(128)))
        store.add_checkpoint(
            CheckpointRecord(
                uuid=checkpoint,
                trial_id=trial_id,
                run_id=run_id,
                total_batches=rows,
                state="COMPLETED",
                location=f"/var/lib/assay/checkpoints/{checkpoint}",
                files={"state_dict.pth": 48_213, "metadata.json": 512},
            )
        )
        levels = ["INFO", "INFO", "INFO", "WARNING", "ERROR", None]
        store.append_logs(
            trial_id,
            run_id,
            [
                LogLine(
                    f"[rank 0] batch {i * max(1, rows // logs)}: loss "
                    f"{floor + 2.3 * math.exp(-i / 8):.4f}",
                    level=levels[i % len(levels)],
                    stream="stderr" if i % 7 == 6 else "stdout",
                )
                for i in range(logs)
            ],
        )
        trial_state = "COMPLETED" if state == "COMPLETED" else "ERROR" if t == 0 else "PAUSED"
        batch = WriteBatch()
        batch.set_trial(
            trial_id,
            state=trial_state,
            total_batches=rows,
            best_validation=best,
            latest_checkpoint=checkpoint,
            start_time=_now(),
            end_time=_now() if trial_state in ("COMPLETED", "ERROR") else None,
            last_error="exit code 7" if trial_state == "ERROR" else None,
        )
        store.apply(batch)
    ended = _now() if state in ("COMPLETED", "CANCELED", "ERROR") else None
    batch = WriteBatch()
    batch.set_experiment(experiment_id, progress=1.0 if ended else 0.4, end_time=ended)
    store.apply(batch)
    return experiment_id


def _credentials() -> str:
    """The first admin's password for the masters started here (ASSAY_INITIAL_ADMIN_PASSWORD,
    else made up), put in the environment with the join token and the CLI's login, so that
    every process started from here inherits them."""
    password = os.environ.get("ASSAY_INITIAL_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
    os.environ["ASSAY_INITIAL_ADMIN_PASSWORD"] = password
    os.environ.setdefault("ASSAY_JOIN_TOKEN", secrets.token_urlsafe(24))
    os.environ["ASSAY_USER"] = "admin"
    os.environ["ASSAY_PASSWORD"] = password
    return password


def _login(base: str, password: str) -> str:
    body = json.dumps({"username": "admin", "password": password}).encode()
    request = urllib.request.Request(
        base + "/api/v1/login", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        token: str = json.loads(reply.read())["token"]
    return token


def _start_master(state_dir: Path, http_port: int, grpc_port: int) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "assay.master.main",
        "--host",
        "127.0.0.1",
        "--grpc-port",
        str(grpc_port),
        "--http-port",
        str(http_port),
        "--state-dir",
        str(state_dir),
    ]
    log = (state_dir / "master.log").open("wb")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


def _wait_http(base: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the master exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/api/v1/health", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("the master's HTTP port did not answer in 60 s")


# Fetches every path given, all at once, as the page's API wrapper does; returns the time,
# the trials of the experiment's reply and the points of the curves' reply.
_BASELINE_SCRIPT = """async ([paths, token]) => {
    const t0 = performance.now();
    const headers = {Authorization: 'Bearer ' + token};
    const replies = await Promise.all(
        paths.map((p) => fetch(p, {headers}).then((r) => r.json())));
    let trials = 0;
    let points = 0;
    for (const r of replies) {
        if (Array.isArray(r.trials)) trials = r.trials.length;
        if (Array.isArray(r.curves)) points += r.curves.reduce((n, c) => n + c.values.length, 0);
    }
    return {ms: performance.now() - t0, trials, points};
}"""


class _Requests:
    """The API paths a page requests until its curves' reply has arrived, in order."""

    def __init__(self, base: str, curves: str) -> None:
        self.base = base
        self.curves = curves  # the start of the curves' path
        self.paths: list[str] = []
        self.curves_in = False

    def _path(self, request: Any) -> str:
        url = str(request.url)
        return url[len(self.base) :] if url.startswith(self.base) else url

    def request(self, request: Any) -> None:
        path = self._path(request)
        if not self.curves_in and path.startswith("/api/") and path not in self.paths:
            self.paths.append(path)

    def finished(self, request: Any) -> None:
        if self._path(request).startswith(self.curves):
            self.curves_in = True


def measure(base: str, experiment_id: int, rounds: int, trials: int, token: str) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    page_ms: list[float] = []
    fetch_ms: list[float] = []
    baseline: list[str] = []
    points = 0
    curves = f"/api/v1/experiments/{experiment_id}/metrics?"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for r in range(rounds + 1):  # round 0 warms the browser and the master's caches
                order = ["page", "fetch"] if r % 2 == 0 else ["fetch", "page"]
                for side in order:
                    context = browser.new_context(viewport={"width": 1400, "height": 900})
                    # Logged in, as after the login page: the app reads its token here.
                    context.add_init_script(f"localStorage.setItem('assay.token', '{token}')")
                    page = context.new_page()
                    if side == "page":
                        requests = _Requests(base, curves)
                        page.on("request", requests.request)
                        page.on("requestfinished", requests.finished)
                        page.goto(f"{base}/experiments/{experiment_id}?metric=loss&group=training")
                        page.wait_for_selector(
                            f'[data-testid="curves"][data-drawn="{trials}"]', timeout=60_000
                        )
                        ms = float(page.evaluate("window.__assayCurvesDrawnAt"))
                        if not baseline:
                            baseline = requests.paths
                            if not any(p.startswith(curves) for p in baseline):
                                raise SystemExit(f"the page asked for no curves: {baseline}")
                        if r:
                            page_ms.append(ms)
                    else:
                        # The baseline: navigation to a tiny same-origin page, then the
                        # same data fetched and parsed; navigation time is counted too.
                        page.goto(f"{base}/api/v1/health")
                        nav = float(
                            page.evaluate(
                                "performance.getEntriesByType('navigation')[0].responseEnd"
                            )
                        )
                        got = page.evaluate(_BASELINE_SCRIPT, [baseline, token])
                        if got["trials"] != trials or not got["points"]:
                            raise SystemExit(f"the baseline fetched something else: {got}")
                        points = int(got["points"])
                        if r:
                            fetch_ms.append(nav + float(got["ms"]))
                    context.close()
        finally:
            browser.close()
    page_median = statistics.median(page_ms)
    fetch_median = statistics.median(fetch_ms)
    return {
        "time_to_curves_s": round(page_median / 1000, 3),
        "time_to_curves_all_s": [round(x / 1000, 3) for x in page_ms],
        "fetch_only_s": round(fetch_median / 1000, 3),
        "ratio": round(page_median / fetch_median, 2),
        "baseline_requests": baseline,
        "curve_points": points,
    }


def serve(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir or tempfile.mkdtemp(prefix="assay-webui-"))
    state_dir.mkdir(parents=True, exist_ok=True)
    store = Store.open(f"sqlite:///{state_dir / 'assay.db'}")
    try:
        if not store.list_experiments().items:
            big = seed_experiment(store, trials=args.trials, rows=args.rows)
            failed = seed_experiment(store, trials=3, rows=300, name="resnet-failed", seed=2)
            store.update_experiment(failed, state="ERROR")
            print(f"seeded experiment {big} ({args.trials} trials x {args.rows} rows) and 1 more")
            fresh = True
        else:
            fresh = False
    finally:
        store.close()
    grpc_port = free_port()
    password = _credentials()
    master = _start_master(state_dir, args.port, grpc_port)
    base = f"http://127.0.0.1:{args.port}"
    procs = [master]
    try:
        _wait_http(base, master)
        for i in range(args.agents):
            cmd = [
                sys.executable,
                "-m",
                "assay.agent.main",
                "--master",
                f"127.0.0.1:{grpc_port}",
                "--slots",
                "2",
                "--slot-type",
                "cpu",
                "--agent-id",
                f"agent-{i}",
                "--work-dir",
                str(state_dir / f"agent-{i}"),
                "--isolation",  # a demo on one's own machine, as `deploy local` runs it
                "none",
            ]
            log = (state_dir / f"agent-{i}.log").open("wb")
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))
        if fresh:
            # Real experiments of the digits example: one paused, one that the agent runs.
            for extra in (["--paused"], []):
                cmd = [sys.executable, "-m", "assay.cli.main", "-m", f"127.0.0.1:{grpc_port}"]
                config = str(ROOT / "examples/digits/adaptive_asha.yaml")
                model = str(ROOT / "examples/digits")
                subprocess.run([*cmd, "experiment", "create", config, model, *extra], check=True)
        print(f"serving {base} (gRPC 127.0.0.1:{grpc_port}, state {state_dir}); Ctrl-C stops")
        print(f"log in as admin with the password {password} (unless this store had one)")
        master.wait()
    except KeyboardInterrupt:
        pass
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 trials x 2,000 rows, 3 rounds")
    parser.add_argument("--rounds", type=int, help="measured rounds (default 7; 3 with --quick)")
    parser.add_argument("--serve", action="store_true", help="seed a demo store and serve it")
    parser.add_argument("--port", type=int, default=8080, help="HTTP port for --serve")
    parser.add_argument("--trials", type=int, help="trials of the large experiment")
    parser.add_argument("--rows", type=int, help="training rows per trial")
    parser.add_argument("--agents", type=int, default=1, help="CPU agents started by --serve")
    parser.add_argument("--state-dir", help="--serve: keep the store here (reused if present)")
    args = parser.parse_args()
    if args.serve:
        args.trials = args.trials or 20
        args.rows = args.rows or 2000
        return serve(args)
    if not (DEFAULT_UI_DIR / "index.html").is_file():
        print(f"the web UI is not built ({DEFAULT_UI_DIR}): cd webui && npm ci && npm run build")
        return 2
    trials = args.trials or 100
    rows = args.rows or (2000 if args.quick else 10_000)
    rounds = args.rounds or (3 if args.quick else 7)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="assay-webui-bench-") as tmp:
        state_dir = Path(tmp)
        store = Store.open(f"sqlite:///{state_dir / 'assay.db'}")
        t0 = time.perf_counter()
        try:
            experiment_id = seed_experiment(store, trials=trials, rows=rows)
        finally:
            store.close()
        seed_s = time.perf_counter() - t0
        print(f"seeded {trials} trials x {rows:,} rows in {seed_s:.1f} s")
        http_port, grpc_port = free_port(), free_port()
        password = _credentials()
        master = _start_master(state_dir, http_port, grpc_port)
        base = f"http://127.0.0.1:{http_port}"
        try:
            _wait_http(base, master)
            figures = measure(base, experiment_id, rounds, trials, _login(base, password))
        finally:
            master.terminate()
            master.wait(timeout=30)
    passed = figures["time_to_curves_s"] <= TARGET_S
    print(
        f"curves drawn {figures['time_to_curves_s']:.3f} s after navigation (median of "
        f"{rounds}); fetch only {figures['fetch_only_s']:.3f} s; ratio {figures['ratio']}; "
        f"target <= {TARGET_S} s: {'met' if passed else 'MISSED'}"
    )
    result = {
        "benchmark": "webui_load",
        "ratio": figures["ratio"],
        "target": f"time_to_curves_s <= {TARGET_S}",
        "passed": passed,
        **figures,
        "trials": trials,
        "rows_per_trial": rows,
        "rounds": rounds,
        "seed_s": round(seed_s, 1),
        "quick": bool(args.quick),
        "wall_s": round(time.perf_counter() - started, 1),
        "chromium": _chromium_version(),
    }
    print(json.dumps(result))
    return 0 if passed else 1


def _chromium_version() -> str:
    try:
        out = subprocess.run([CHROMIUM, "--version"], capture_output=True, text=True, timeout=20)
        return out.stdout.strip()
    except OSError:
        return "unknown"


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
