"""Alembic migrations of the store schema (see env.py; run through store.migrate)."""
