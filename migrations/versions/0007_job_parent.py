"""jobs.parent_job_id: a job started from a checkpoint of an earlier job (spec.continue_from).

Revision ID: 0007_job_parent
Revises: 0006_webhooks
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_job_parent"
down_revision: str | None = "0006_webhooks"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("parent_job_id", sa.String(40), nullable=True))
        batch.create_index(batch.f("ix_jobs_parent_job_id"), ["parent_job_id"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index(batch.f("ix_jobs_parent_job_id"))
        batch.drop_column("parent_job_id")
