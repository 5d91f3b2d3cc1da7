"""Persistence for BroRL as a service: settings, tables, sessions, the job state machine,
keys, datasets, webhooks and artifact files. The one package that speaks SQL; api/ and
worker/ import it, trainer/ never does.

Modules: settings (BRORL_* configuration), db (engines and sessions), tables (the tables;
webhook_tables and completion_usage beside them), jobs (state machine; re-exports the reads
in job_queries), job_pause, probes, keys, datasets, webhooks (endpoints and the delivery
outbox), completion_usage (the completion token quota's count), artifacts, model_paths,
migrate (Alembic from code), errors.
"""
# Every table on Base.metadata whichever module a process imports first (Alembic compares it).
from store import completion_usage, webhook_tables  # noqa: E402,F401
