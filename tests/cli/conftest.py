"""The CLI tests run on an isolated data dir (tests/support/jobs.py)."""
from tests.support.jobs import data_dir  # noqa: F401 (fixture)
