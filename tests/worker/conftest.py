"""The worker tests run on an isolated data dir with the trainer double (tests/support/jobs.py)."""
from tests.support.jobs import data_dir, new_job, tenant_id  # noqa: F401 (fixtures)
