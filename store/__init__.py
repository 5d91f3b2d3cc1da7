"""Persistence for BroRL as a service: settings, models, sessions, the job state machine,
keys, datasets and artifact files. The one package that speaks SQL; api/ and worker/ import
it, trainer/ never does.

Modules: settings (BRORL_* configuration), db (engines and sessions), models (tables),
jobs (state machine; re-exports the reads in job_queries), keys, datasets, artifacts,
migrate (Alembic from code), errors.
"""
