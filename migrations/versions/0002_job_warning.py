"""jobs.warning: the trainer's latest warning, shown in the job's status.

Revision ID: 0002_job_warning
Revises: 0001
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002_job_warning"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("warning", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "warning")
