"""The one switch between skipping and failing for a missing server or program
(tests/support/services.py): a skip on a developer's machine, a failure in CI."""
from __future__ import annotations

import pytest

from tests import conftest
from tests.support.services import in_ci, needs_service, require_module, require_service


@pytest.mark.parametrize("value,ci", [("true", True), ("1", True), ("yes", True),
                                      ("", False), ("0", False), ("false", False)])
def test_ci_is_read_from_the_environment(monkeypatch, value, ci):
    monkeypatch.setenv("CI", value)
    assert in_ci() is ci


def test_a_missing_service_fails_in_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="Redis is missing, and CI must provide it: down"):
        require_service("Redis", "down")


def test_a_missing_service_skips_elsewhere(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="Redis is not available here: down"):
        require_service("Redis", "down")


@pytest.mark.parametrize("ci", ["true", ""])
def test_a_present_service_lets_the_test_run(monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    require_service("Redis", None)
    require_service("Redis", "")


def test_a_missing_package_fails_in_ci_and_skips_elsewhere(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="the no_such_package_here package"):
        require_module("no_such_package_here")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="ModuleNotFoundError"):
        require_module("no_such_package_here")
    assert require_module("json").dumps([1]) == "[1]"



@pytest.mark.parametrize("ci", ["", "true"])
def test_a_module_that_requires_a_missing_package_is_skipped_whole_or_fails_in_ci(tmp_path, ci):
    """At a module's top (as the Ray tests use it): a skip of the module here, an error in CI;
    never pytest's "skip outside of a test" collection error when skipping is right."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "test_needs_it.py").write_text(
        "from tests.support.services import require_module\n"
        "require_module('no_such_package_here')\n"
        "def test_never_runs():\n    pass\n")
    repo = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "test_needs_it.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "CI": ci, "PYTHONPATH": str(repo)})
    if ci:
        assert run.returncode != 0 and "the no_such_package_here package is missing, and CI must provide it" \
            in run.stdout, run.stdout
    else:
        assert run.returncode == 5 and "1 skipped" in run.stdout, run.stdout  # 5: no test ran
        assert "the no_such_package_here package is not available here" in run.stdout

class _Item:
    def __init__(self, *marks):
        self.marks = [m.mark for m in marks]

    def iter_markers(self, name):
        return (m for m in self.marks if m.name == name)


def test_the_mark_is_applied_at_set_up(monkeypatch):
    monkeypatch.setenv("CI", "true")
    conftest.pytest_runtest_setup(_Item(needs_service("Chromium", None)))
    with pytest.raises(pytest.fail.Exception, match="Chromium is missing"):
        conftest.pytest_runtest_setup(_Item(needs_service("Redis", None),
                                            needs_service("Chromium", "no /usr/bin/chromium")))
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="no /usr/bin/chromium"):
        conftest.pytest_runtest_setup(_Item(needs_service("Chromium", "no /usr/bin/chromium")))
