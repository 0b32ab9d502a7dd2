"""Store fixtures: every contract test runs on a SQLite file AND on PostgreSQL.

PostgreSQL is the server at ASSAY_TEST_POSTGRES (default: postgres@127.0.0.1:5432, trust
auth). Each test session (each xdist worker) creates its own uniquely named database and
drops it at the end. An unreachable server FAILS the PostgreSQL tests rather than skipping
them: a suite that silently skips PostgreSQL would prove nothing about it.

The schema is migrated once per session and per kind of database (`_migrated`): a test's
`store` opens a copy of that migrated database (a copied SQLite file, a PostgreSQL
database made again from a template database), so only the migration tests, which ask
for an empty `db_url` and open it themselves, pay for a migration. A master started by a
fixture in its process finds the same migrated SQLite file in its state directory
(`seeded`).
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from assay.master.store import Store

SERVER = os.environ.get("ASSAY_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432")


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    name = f"assay_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(f"{SERVER}/postgres", isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as e:
        pytest.fail(f"PostgreSQL at {SERVER} is required for the store tests: {e}")
    try:
        yield f"{SERVER}/{name}"
    finally:
        with admin.connect() as c:
            for database in (name, _template_of(name)):
                c.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        admin.dispose()


def _empty_postgres(url: str) -> None:
    """Give the next test an empty database, as a fresh SQLite file is."""
    engine = create_engine(url)
    with engine.begin() as c:
        c.execute(text("DROP SCHEMA public CASCADE"))
        c.execute(text("CREATE SCHEMA public"))
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'assay.db'}"
    url: str = request.getfixturevalue("postgres_url")
    _empty_postgres(url)
    return url


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    """A store on `db_url`, migrated (a copy of the session's migrated database)."""
    s = Store.open(migrated(db_url))
    try:
        yield s
    finally:
        s.close()


def migrated(url: str) -> str:
    """Lay a migrated schema at `url` (an empty database of `db_url`), and return `url`.

    A SQLite file is copied from one migrated once per session; a PostgreSQL database is
    made again from a template database migrated once per session (`CREATE DATABASE ...
    TEMPLATE`), which takes a fraction of a migration's time."""
    if url.startswith("sqlite:///"):
        shutil.copyfile(_migrated_sqlite(), url.removeprefix("sqlite:///"))
        return url
    server, name = url.rsplit("/", 1)
    template = _postgres_template(server, name)
    admin = create_engine(f"{server}/postgres", isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
            c.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
    finally:
        admin.dispose()
    return url


def seeded(state_dir: Path) -> Path:
    """`state_dir`, made with a migrated SQLite store in it (as a master's first start
    leaves it), so that a master started there skips the migration; left alone if it
    exists already (a master started again on its state)."""
    if not state_dir.exists():
        state_dir.mkdir(parents=True, mode=0o700)
        store = state_dir / "assay.db"
        shutil.copyfile(_migrated_sqlite(), store)
        store.chmod(0o600)
    return state_dir


def _template_of(name: str) -> str:
    return f"{name}_migrated"


@functools.cache
def _migrated_sqlite() -> Path:
    """A SQLite file migrated to the head revision, once per session."""
    folder = Path(tempfile.mkdtemp(prefix="assay-migrated-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = folder / "assay.db"
    Store.open(f"sqlite:///{path}").close()
    return path


@functools.cache
def _postgres_template(server: str, name: str) -> str:
    """A database migrated to the head revision beside `name`, once per session (dropped
    with it by `postgres_url`)."""
    template = _template_of(name)
    admin = create_engine(f"{server}/postgres", isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{template}"'))
    finally:
        admin.dispose()
    Store.open(f"{server}/{template}").close()  # closed: a template must have no session
    return template
