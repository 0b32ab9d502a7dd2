"""Schema migrations with Alembic, shipped in the package.

`migrate(engine)` creates the schema in an empty database and upgrades an older one. On
PostgreSQL it holds an advisory lock for the whole upgrade, so masters starting together
migrate once; on SQLite the write transaction serialises them. A database migrated by
a newer Assay than this one is refused, naming the release that migrated it.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, delete, insert, inspect, select

from assay import __version__
from assay.master.errors import SchemaError
from assay.master.store._engine import writer
from assay.master.store._models import SchemaInfo

MIGRATIONS = Path(__file__).parent / "migrations"
# Any constant works; two masters must use the same one.
ADVISORY_LOCK_KEY = 0x41535341  # "ASSA"


def alembic_config(connection: Connection | None = None, location: Path = MIGRATIONS) -> Config:
    config = Config()
    config.set_main_option("script_location", str(location))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision(location: Path = MIGRATIONS) -> str:
    head = ScriptDirectory.from_config(alembic_config(location=location)).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def migrate(engine: Engine, location: Path = MIGRATIONS) -> str:
    """Bring the schema to this release's head; return the revision it is at."""
    with writer(engine).connect() as connection:
        if connection.dialect.name != "sqlite":
            with connection.begin():
                connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({ADVISORY_LOCK_KEY})")
                return _upgrade(connection, location)
        # SQLite alters a table by copying it, dropping the old one and renaming the copy;
        # with foreign keys on, the DROP would cascade into every child table. The pragma
        # only changes outside a transaction, so it is set on the driver before BEGIN.
        driver = connection.connection.driver_connection
        assert driver is not None
        driver.execute("PRAGMA foreign_keys=OFF")
        try:
            with connection.begin():
                revision = _upgrade(connection, location)
                broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                if broken:
                    raise SchemaError(
                        f"the upgrade would leave rows without their parents: {broken[:5]}; "
                        "nothing was changed"
                    )
                return revision
        finally:
            driver.execute("PRAGMA foreign_keys=ON")


def _upgrade(connection: Connection, location: Path) -> str:
    config = alembic_config(connection, location)
    script = ScriptDirectory.from_config(config)
    current = MigrationContext.configure(connection).get_current_revision()
    if current is not None and _unknown(script, current):
        raise SchemaError(_too_new_message(connection, current, script))
    command.upgrade(config, "head")
    _record_release(connection)
    head = script.get_current_head()
    assert head is not None
    return head


def _unknown(script: ScriptDirectory, revision: str) -> bool:
    try:
        return script.get_revision(revision) is None
    except Exception:  # alembic raises for ids it has never seen
        return True


def _too_new_message(connection: Connection, revision: str, script: ScriptDirectory) -> str:
    release = None
    if inspect(connection).has_table(SchemaInfo.__tablename__):
        release = connection.execute(
            select(SchemaInfo.value).where(SchemaInfo.key == "assay_version")
        ).scalar()
    by = f"Assay {release}" if release else "a newer Assay"
    run = f"Assay {release} or newer" if release else "a newer Assay"
    return (
        f"the database schema is at revision {revision}, written by {by}; this is Assay "
        f"{__version__}, which knows schema revisions up to {script.get_current_head()}. "
        f"Run {run} against this database, or point this master at another one."
    )


def _record_release(connection: Connection) -> None:
    connection.execute(delete(SchemaInfo).where(SchemaInfo.key == "assay_version"))
    connection.execute(insert(SchemaInfo).values(key="assay_version", value=__version__))
