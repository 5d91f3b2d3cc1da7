"""How freed tensors go back to the OS: glibc's malloc, set once per run (`BRORL_MALLOC`).

torch's CPU allocator has no cache: every tensor is a malloc and every free a free. glibc
serves large blocks with their own mmap and unmaps them on free, but it raises that threshold
to the largest block freed so far (up to 32 MiB), after which blocks of a few MiB (a layer's
activations for a micro-batch, one decode step's cache) come from the heap, whose free space
stays resident: the peak RSS then follows how the phases of a step interleave, not what is
alive. Three modes (`MODES`), picked by `BRORL_MALLOC`:

- `default` (the default): glibc as it is. Its heap reuses freed blocks without page faults:
  the fastest (measured on the 24 M model, one thread: a step at 256 tokens 85-101 s against
  142 s with the fixed threshold), for a peak RSS ~8-12 % higher.
- `mmap_threshold`: the threshold fixed at 64 KiB (`mallopt(M_MMAP_THRESHOLD)`, as
  `MALLOC_MMAP_THRESHOLD_` does at start-up): every tensor above it is its own mapping, so
  the RSS follows the live tensors (the lowest peak), but each one is fresh pages, paid in
  page faults. For CPU hosts short of memory. A fixed 1 or 4 MiB threshold kept most of the
  RSS gain at the same cost; 16 or 32 MiB cost nothing and kept nothing (section 13a).
- `trim`: glibc's thresholds, and `malloc_trim(0)` at the step's phase boundaries (after
  generation, after the update and its optimizer step, after a weight-sync copy;
  `trainer.step.run_step`): the heap's free pages go back to the OS between phases. It did
  not lower the peak (which is inside the update's micro-batches), nor did a trim after every
  micro-batch.

Measured side by side in docs/results.md, section 13a (`bench/malloc_modes.py`), with
jemalloc (`LD_PRELOAD`: not something a pip install brings) slower still. An explicit
`MALLOC_MMAP_THRESHOLD_` in the environment is left alone in every mode; other C libraries
than glibc are left alone.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
THRESHOLD_BYTES = 64 * 1024
MODES = ("default", "mmap_threshold", "trim")
DEFAULT_MODE = "default"

_mode = "default"  # this process's mode, set by `configure_malloc` (mallopt is process-wide too)


@functools.lru_cache(maxsize=1)
def _libc():
    """glibc's handle, or None (musl, macOS: nothing to set). Looked up once: find_library
    runs `ldconfig -p`, a fork, and `trim` asks at every phase boundary."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018  (both are glibc's)
    except (OSError, AttributeError):
        return None
    return libc


def fix_mmap_threshold(threshold: int = THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at `threshold` bytes; True when it was set."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    libc = _libc()
    if libc is None:
        return False
    ok = bool(libc.mallopt(M_MMAP_THRESHOLD, threshold))
    log.info("malloc mmap threshold fixed at %d bytes: %s", threshold, ok)
    return ok


def configure_malloc(mode: str = DEFAULT_MODE) -> str:
    """Apply `mode` (one of `MODES`) to this process; returns it."""
    global _mode
    if mode not in MODES:
        raise ValueError(f"malloc mode {mode!r}: choose one of {', '.join(MODES)}")
    if mode == "mmap_threshold":
        fix_mmap_threshold()
    _mode = mode
    log.info("malloc mode: %s", mode)
    return mode


def release_freed() -> bool:
    """At a phase boundary: in `trim` mode, give the heap's free pages back to the OS
    (`malloc_trim(0)`); True when glibc released something."""
    if _mode != "trim":
        return False
    libc = _libc()
    return bool(libc.malloc_trim(0)) if libc is not None else False
