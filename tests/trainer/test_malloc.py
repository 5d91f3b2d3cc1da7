"""glibc's mmap threshold is fixed for a run, so freed tensors leave the RSS."""
import subprocess
import sys

import pytest

from trainer.malloc import fix_mmap_threshold

# A 16 MiB tensor freed (glibc's moving threshold rises to 16 MiB), then 32 tensors of 2 MiB
# alive at once with small live blocks between them, then freed: from the heap they stay
# resident (the small blocks pin it); each in its own mapping, they leave the RSS.
PROBE = """
import os, sys, torch
sys.path.insert(0, {root!r})
from trainer.malloc import fix_mmap_threshold
if {fix}:
    assert fix_mmap_threshold()
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
x = torch.ones(4 * 2**20)
del x
base = rss()
big, keep = [], []
for i in range(32):
    big.append(torch.ones(2**19))
    keep.append(torch.ones(1000))
del big
print(rss() - base)
"""


def _grown(fix: bool) -> float:
    import trainer

    root = str(__import__("pathlib").Path(trainer.__file__).parents[1])
    env = {k: v for k, v in __import__("os").environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    out = subprocess.run([sys.executable, "-c", PROBE.format(root=root, fix=fix)], env=env,
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_fixed_threshold_returns_freed_blocks():
    assert _grown(True) < 4.0 < 32.0 < _grown(False)


def test_explicit_environment_is_left_alone(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert fix_mmap_threshold() is False
