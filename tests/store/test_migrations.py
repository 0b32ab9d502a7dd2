"""Migrations: create, upgrade, refuse a newer schema, migrate once under concurrency."""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text

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
