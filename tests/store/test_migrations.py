"""Migrations: create, upgrade, refuse a newer schema, migrate once under concurrency."""

from __future__ import annotations

import math
import multiprocessing
import random
import threading
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import delete, select, text
from sqlalchemy import inspect as sa_inspect

from assay.master.errors import SchemaError
from assay.master.store import Store, current_revision, head_revision, migrate
from assay.master.store._engine import make_engine
from assay.master.store._models import Base
from tests.store import _seed as seed


def test_an_empty_database_gets_the_schema_at_head(db_url: str) -> None:
    engine = make_engine(db_url)
    assert migrate(engine) == head_revision()
    assert current_revision(engine) == head_revision()
    assert migrate(engine) == head_revision()  # a second run is a no-op
    engine.dispose()


def test_the_migrated_schema_equals_the_models(db_url: str) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        diff = compare_metadata(context, Base.metadata)
    engine.dispose()
    assert diff == []


def test_a_newer_schema_is_refused_and_left_alone(db_url: str) -> None:
    store = Store.open(db_url)
    eid = seed.experiment(store, name="keep", owner="a")
    with store.write() as s:
        s.execute(text("UPDATE alembic_version SET version_num = 'f00d'"))
        s.execute(text("UPDATE schema_info SET value = '9.9.9' WHERE key = 'assay_version'"))
    with pytest.raises(
        SchemaError, match=r"revision f00d, written by Assay 9\.9\.9.*Run Assay 9\.9\.9"
    ):
        Store.open(db_url)
    assert current_revision(store.engine) == "f00d"
    assert store.get_experiment(eid).name == "keep"
    store.close()


def test_concurrent_masters_migrate_once(db_url: str) -> None:
    results: list[str] = []
    errors: list[BaseException] = []

    def start() -> None:
        try:
            engine = make_engine(db_url)
            results.append(migrate(engine))
            engine.dispose()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert results == [head_revision()] * 4
    engine = make_engine(db_url)
    with engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM alembic_version")).scalar() == 1
    engine.dispose()


def _write_many(url: str, trial_id: int, run_id: int, start: int) -> None:
    from assay.master.store import MetricReport

    store = Store.open(url, migrate_schema=False)
    for i in range(10):
        base = start + i * 100
        store.report_metrics(
            trial_id,
            run_id,
            "training",
            [MetricReport(b, {"loss": 1.0}) for b in range(base, base + 100)],
        )
    store.close()


def test_processes_writing_one_sqlite_file_at_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    store = Store.open(url)
    _, tid, run = seed.trial_with_run(store)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_many, args=(url, tid, run, k * 1000)) for k in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    curve = store.trial_curve(tid, "loss", group="training", max_points=100_000)
    assert len(curve) == 4000
    store.close()


DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("snapshot", sorted(p.name for p in DATA.glob("schema-*.sqlite")))
def test_databases_of_past_schema_versions_upgrade_with_their_data(
    tmp_path: Path, snapshot: str
) -> None:
    # Each checked-in file was written by the release that introduced its revision.
    copy = tmp_path / snapshot
    copy.write_bytes((DATA / snapshot).read_bytes())
    store = Store.open(f"sqlite:///{copy}")
    assert current_revision(store.engine) == head_revision()
    [experiment] = store.list_experiments(label="old").items
    [trial] = store.list_trials(experiment.id)
    curve = store.trial_curve(trial.id, "loss")
    assert len(curve) == 50
    assert curve[0] == (1, 1.0)
    with store.read() as s:  # the 16-batch rollup level is there for the old rows too
        level_0 = text("SELECT sum(count) FROM metric_rollups WHERE level = 0")
        assert s.execute(level_0).scalar() == 50
    assert store.get_checkpoint("c-0001").files == {"models.pt": 123}
    assert [line.message for line in store.tail_logs(trial.id)] == ["hello from 0001"]
    store.close()


def test_a_table_rebuilding_upgrade_keeps_child_rows(tmp_path: Path, db_url: str) -> None:
    # SQLite rebuilds a table to alter it; a cascade on the DROP would empty its children.
    import shutil

    from assay.master.store import MetricReport
    from assay.master.store._migrate import MIGRATIONS

    location = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS, location)
    (location / "versions" / "9999_widen_request_id.py").write_text(
        '"""widen trials.request_id"""\n'
        "import sqlalchemy as sa\n"
        "from alembic import op\n\n"
        'revision = "9999"\n'
        f"down_revision = {head_revision()!r}\n"
        "branch_labels = None\n"
        "depends_on = None\n\n\n"
        "def upgrade() -> None:\n"
        '    with op.batch_alter_table("trials") as batch:\n'
        '        batch.alter_column("request_id", type_=sa.String(128))\n\n\n'
        "def downgrade() -> None:\n"
        "    pass\n"
    )
    store = Store.open(db_url)
    _, tid, run = seed.trial_with_run(store)
    store.report_metrics(tid, run, "training", [MetricReport(b, {"loss": 1.0}) for b in range(5)])
    assert migrate(store.engine, location) == "9999"
    assert len(store.trial_curve(tid, "loss", group="training")) == 5
    assert store.get_trial(tid).request_id == "exp-r1"
    store.close()


# --- 0004: rollup level 0 rebuilt for the metrics stored before it existed ------------------


def _at_0003(tmp_path: Path, db_url: str) -> Store:
    """A store on a database migrated to 0003 only, as the release before 0004 left it."""
    import shutil

    from assay.master.store._migrate import MIGRATIONS

    location = tmp_path / "migrations-0003"
    shutil.copytree(MIGRATIONS, location)
    for later in (location / "versions").glob("*_*.py"):
        if later.name[:4] > "0003":
            later.unlink()
    engine = make_engine(db_url)
    assert migrate(engine, location) == "0003"
    engine.dispose()
    return Store.open(db_url, migrate_schema=False)


def _live(store: Store, trial_id: int) -> dict[tuple[str, str], list[tuple[int, float | None]]]:
    """(group, name) -> the trial's live points, NaN as None."""
    from assay.master.store import Metric

    out: dict[tuple[str, str], list[tuple[int, float | None]]] = {}
    with store.read() as s:
        rows = s.execute(
            select(Metric.group, Metric.name, Metric.total_batches, Metric.value)
            .where(Metric.trial_id == trial_id, Metric.superseded.is_(False))
            .order_by(Metric.group, Metric.name, Metric.total_batches)
        )
        for group, name, batches, value in rows:
            out.setdefault((group, name), []).append((batches, value))
    return out


def _rollups(store: Store, trial_id: int) -> list[tuple[Any, ...]]:
    """The trial's rollup rows, every level, without the trial id."""
    from assay.master.store._models import MetricRollup

    columns = [c for c in MetricRollup.__table__.columns if c.name != "trial_id"]
    with store.read() as s:
        rows = s.execute(
            select(*columns)
            .where(MetricRollup.trial_id == trial_id)
            .order_by(
                MetricRollup.group, MetricRollup.name, MetricRollup.level, MetricRollup.bucket
            )
        )
        return [tuple(row) for row in rows]


def _reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[Any, ...]]]:
    """(SQL, parameters) of every curve query from now on."""
    from assay.master.store import _curves

    seen: list[tuple[str, tuple[Any, ...]]] = []
    fetch = _curves._fetch

    def spy(session: Any, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        seen.append((sql, params))
        return fetch(session, sql, params)

    monkeypatch.setattr(_curves, "_fetch", spy)
    return seen


def test_level_0_is_rebuilt_for_metrics_stored_before_it(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from assay.master.store import MetricReport, _curves
    from assay.master.store._models import MetricRollup

    store = _at_0003(tmp_path, db_url)
    eid, old, run = seed.trial_with_run(store, "old")
    rng = random.Random(4)

    def loss(b: int) -> float:
        return 50.0 if b == 2001 else -50.0 if b == 3999 else math.sin(b / 300) + rng.gauss(0, 0.1)

    def accuracy(b: int) -> float:
        return [math.nan, math.inf, -math.inf, 0.5, 0.5][b % 5] if b % 50 == 0 else b / 10_000

    def report(trial: int, run_id: int, batches: range) -> None:
        store.report_metrics(
            trial, run_id, "training", [MetricReport(b, {"loss": loss(b)}) for b in batches]
        )
        store.report_metrics(
            trial,
            run_id,
            "validation",
            [MetricReport(b, {"acc": accuracy(b)}) for b in batches if b % 10 == 0],
        )

    # Reported before level 0 existed: the level has none of these rows.
    report(old, run, range(1, 4001))
    with store.write() as s:
        s.execute(delete(MetricRollup).where(MetricRollup.level == 0))
    # Then by a release with level 0 but no migration: partial buckets (4000-4015 holds
    # batch 4000 from before), a restore that supersedes past 4500, a second run.
    report(old, run, range(4001, 5001))
    run2 = seed.start_run(store, old, restored_batches=4500)
    report(old, run2, range(4501, 6501))
    reads = _reads(monkeypatch)
    before = store.trial_curve(old, "loss", group="training", max_points=250)
    level_0 = (_curves._ROLLUP_SQL, (old, "training", "loss", 0))
    assert level_0 in reads  # tried, found short of rows, and left for a coarser source
    assert reads[-1] != level_0

    assert migrate(store.engine) == head_revision()

    # A fresh trial given the same live points writes what the store computes itself.
    fresh = seed.trial(store, eid, request_id="fresh")
    fresh_run = seed.start_run(store, fresh)
    live = _live(store, old)
    for (group, name), points in live.items():
        reports = [MetricReport(b, {name: math.nan if v is None else v}) for b, v in points]
        store.report_metrics(fresh, fresh_run, group, reports)
    assert _live(store, fresh) == live
    assert _rollups(store, old) == _rollups(store, fresh)
    reads.clear()
    curve = store.trial_curve(old, "loss", group="training", max_points=250)
    assert [sql for sql, _ in reads] == [_curves._EXTENT_SQL, _curves._ROLLUP_SQL]
    assert reads[-1] == level_0
    assert curve != before  # drawn finer than the fallback could
    for group, name in live:
        curve = store.trial_curve(old, name, group=group, max_points=250)
        assert curve == store.trial_curve(fresh, name, group=group, max_points=250)
    with store.read() as s:
        count = len(live[("training", "loss")])
        drawn = _curves._read_rollups(s, (old, "training", "loss"), 0, count, 250)
        assert drawn == _curves._read_rollups(s, (fresh, "training", "loss"), 0, count, 250)
    assert drawn is not None
    assert (2001, 50.0) in drawn
    store.close()


# --- 0006: agents' credential hashes -----------------------------------------------------


def test_agents_recorded_before_0006_have_no_credential_and_keep_their_rows(
    tmp_path: Path, db_url: str
) -> None:
    import datetime as dt
    import shutil

    from assay.master.store import WriteBatch
    from assay.master.store._migrate import MIGRATIONS

    location = tmp_path / "migrations-0005"
    shutil.copytree(MIGRATIONS, location)
    for later in (location / "versions").glob("*_*.py"):
        if later.name[:4] > "0005":
            later.unlink()
    engine = make_engine(db_url)
    assert migrate(engine, location) == "0005"
    with engine.begin() as c:
        c.execute(
            text(
                "INSERT INTO agents (id, address, slot_type, slots, devices, state, "
                "registered_at, last_heartbeat) VALUES ('old', 'h', 'cpu', 2, '[]', 'ACTIVE', "
                "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
            )
        )
    assert migrate(engine) == head_revision()
    engine.dispose()
    store = Store.open(db_url)
    assert [(a.id, a.slots) for a in store.list_agents()] == [("old", 2)]
    assert store.agent_credentials() == {}
    batch = WriteBatch()  # its next join gives it one
    batch.agent_registered(
        "old",
        slot_type="cpu",
        slots=2,
        devices=[],
        address="h",
        now=dt.datetime.now(dt.UTC),
        credential_sha256="a" * 64,
    )
    store.apply(batch)
    assert store.agent_credentials() == {"old": "a" * 64}
    store.close()


# --- 0012: the stop under way for a run ----------------------------------------------------


def _downgrade(engine: Any, revision: str) -> None:
    from alembic import command

    from assay.master.store._migrate import alembic_config

    with engine.connect() as connection:
        if connection.dialect.name == "sqlite":  # as `migrate`: no cascade on the rebuild
            connection.connection.driver_connection.execute("PRAGMA foreign_keys=OFF")
        with connection.begin():
            command.downgrade(alembic_config(connection), revision)


def test_a_runs_stop_is_kept_and_0012_downgrades_and_upgrades_with_the_rows(
    db_url: str,
) -> None:
    import datetime as dt

    from assay.master.store import WriteBatch

    store = Store.open(db_url)
    _, trial_id, run_id = seed.trial_with_run(store)
    now = dt.datetime.now(dt.UTC)
    batch = WriteBatch()
    for name in ("killed", "plain"):
        placement = [{"agent_id": "a0", "slots": [0]}]
        batch.add_allocation(name, trial_id=trial_id, run_id=run_id, placement=placement, now=now)
    batch.set_allocation("killed", stopping="kill_trial")  # merged into its insert
    store.apply(batch)
    stops = {a.id: a.stopping for a in store.active_allocations()}
    assert stops == {"killed": "kill_trial", "plain": None}
    batch = WriteBatch()
    batch.set_allocation("plain", stopping="preempt")  # an update of a committed row
    store.apply(batch)
    assert {a.id: a.stopping for a in store.active_allocations()} == {
        "killed": "kill_trial",
        "plain": "preempt",
    }
    engine = store.engine
    _downgrade(engine, "0011")
    assert current_revision(engine) == "0011"
    with engine.connect() as c:
        columns = {col["name"] for col in sa_inspect(c).get_columns("allocations")}
        assert "stopping" not in columns
        kept = c.execute(text("SELECT id, trial_id FROM allocations ORDER BY id")).all()
    assert [tuple(r) for r in kept] == [("killed", trial_id), ("plain", trial_id)]
    with engine.begin() as c:  # written by a release before 0012
        c.execute(
            text(
                "INSERT INTO allocations (id, trial_id, run_id, state, placement, created_at) "
                "VALUES ('old', :t, :r, 'ASSIGNED', '[]', CURRENT_TIMESTAMP)"
            ),
            {"t": trial_id, "r": run_id},
        )
    assert migrate(engine) == head_revision()
    stops = {a.id: a.stopping for a in store.active_allocations()}
    assert stops == {"killed": None, "old": None, "plain": None}  # the kind went with 0011
    store.close()
