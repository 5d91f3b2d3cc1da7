"""jobs.kind and jobs.result: pass@k probes run as jobs of kind `probe`, with their figures.

A probe shares the job row and its state machine (claim, heartbeat, fencing, cancel, reaper)
instead of a table of its own; existing rows are training jobs.

Revision ID: 0004_job_kind_result
Revises: 0003_job_samples
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004_job_kind_result"
down_revision: str | None = "0003_job_samples"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    json_type = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("kind", sa.String(length=32), nullable=False, server_default="train"))
        batch.add_column(sa.Column("result", json_type, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("result")
        batch.drop_column("kind")
