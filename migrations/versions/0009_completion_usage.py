"""completion_usage: tokens each finished completion call of a tenant used, for the daily
completion token quota (a sum over the last 24 hours, alike in every API process).

Revision ID: 0009_completion_usage
Revises: 0008_sample_turns
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_completion_usage"
down_revision: str | None = "0008_sample_turns"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    big_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    op.create_table(
        "completion_usage",
        sa.Column("id", big_id, autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(100), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE",
                                name=op.f("fk_completion_usage_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_completion_usage")),
    )
    op.create_index("ix_completion_usage_tenant_id_created_at", "completion_usage", ["tenant_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_completion_usage_tenant_id_created_at", table_name="completion_usage")
    op.drop_table("completion_usage")
