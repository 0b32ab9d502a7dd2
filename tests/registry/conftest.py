"""The registry's store tests run on SQLite AND PostgreSQL, with the store tests' fixtures."""

from tests.store.conftest import db_url, postgres_url, store

__all__ = ["db_url", "postgres_url", "store"]
