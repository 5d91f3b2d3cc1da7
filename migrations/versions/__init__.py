"""Alembic revisions, oldest first by id (Alembic skips this file)."""
