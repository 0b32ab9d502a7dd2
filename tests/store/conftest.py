"""Store fixtures: every contract test runs on a SQLite file AND on PostgreSQL.

PostgreSQL is the server at ASSAY_TEST_POSTGRES (default: postgres@127.0.0.1:5432, trust
auth). Each test session creates its own uniquely named database and drops it at the end.
An unreachable server FAILS the PostgreSQL tests rather than skipping them: a suite that
silently skips PostgreSQL would prove nothing about it.
"""

from __future__ import annotations

import os
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
            c.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"),
                {"n": name},
            )
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
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
    s = Store.open(db_url)
    try:
        yield s
    finally:
        s.close()
