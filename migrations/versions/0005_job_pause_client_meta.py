"""jobs.pause_requested and jobs.client_meta: pausing a job, and what an OpenAI-shaped request
said that the spec does not hold.

`pause_requested` is the flag a running job's worker reads with its heartbeat (like
`cancel_requested`): it stops as for a cancel, keeps its checkpoints and the job becomes
`paused`; resuming queues it again and the next attempt resumes from that checkpoint.
`client_meta` holds the OpenAI fine-tuning surface's own fields of a job (`metadata`,
`suffix`, `validation_file`, the hyperparameters as asked; api/openai): null for jobs made
with the native API.

Revision ID: 0005_job_pause_client_meta
Revises: 0004_job_kind_result
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005_job_pause_client_meta"
down_revision: str | None = "0004_job_kind_result"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    json_type = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("pause_requested", sa.Boolean(), nullable=False,
                                   server_default=sa.false()))
        batch.add_column(sa.Column("client_meta", json_type, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("client_meta")
        batch.drop_column("pause_requested")
