"""Helpers that more than one test room uses, imported by name where they are used (never
through a conftest):

- `fake_trainer`: the trainer double (`FAKE_ENTRYPOINT`, set as BRORL_TRAINER_ENTRYPOINT) for
  the tests of the service's plumbing: tests/worker, tests/faults, tests/e2e (not test_ranks);
- `jobs`: an isolated data dir with a migrated SQLite database, jobs for the trainer double,
  a throwaway PostgreSQL database;
- `upstack`: `brorl up` as a subprocess, for tests/e2e and tests/dashboard;
- `tinyprebuild`: a capped builtin:tiny warm start for the tests that train on it.
"""
