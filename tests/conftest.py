"""Suite-wide test settings."""
import os
import tempfile

from tests.support.services import require_service

# builtin:tiny models are cached by (task, config, seed); the suite builds its own in a fresh
# folder so that results never depend on a developer's ~/.cache/brorl.
os.environ.setdefault("BRORL_CACHE_DIR", tempfile.mkdtemp(prefix="brorl-test-cache-"))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "service(name, why_missing): needs that server or program; skipped without "
        "it, failed in CI (tests/support/services.py)")


def pytest_runtest_setup(item):
    for mark in item.iter_markers("service"):
        require_service(*mark.args)
