"""job_samples.messages and job_samples.env: a multi-turn sample's transcript and its counts.

A sample of a job with `task.env` is a conversation: the model's turns, its tool calls, the
tool results. `messages` keeps it (a list of chat messages, each content cut like the
completion); `env` keeps the episode's counts ({"turns", "tool_calls", "tool_errors"}). Both
are nullable: single-turn samples, and every row stored before this revision, have neither.

Revision ID: 0008_sample_turns
Revises: 0007_job_parent
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008_sample_turns"
down_revision: str | None = "0007_job_parent"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("job_samples") as batch:
        batch.add_column(sa.Column("messages", JSON, nullable=True))
        batch.add_column(sa.Column("env", JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_samples") as batch:
        batch.drop_column("env")
        batch.drop_column("messages")
