"""Which isolation layer grader sandboxes use here, and the refusal when none meets the bar.

The layers, best first, and what each holds are in layer.py. A layer counts only after a real
server started on it graded a sample (`self_test` in process.py); the first that does is
this process's layer (`layer_status`, detected once per process). Without one, tenant code
is refused with `SandboxUnavailable` saying why each layer failed, unless the operator set
BRORL_UNSAFE_GRADERS=1 (read fresh at every call).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from trainer.graders.sandbox.layer import (
    BWRAP_MISSING, UNSAFE_ENV, SandboxUnavailable, bwrap_binary, landlock_abi,
    unreachable_for_others)
from trainer.graders.sandbox.process import self_test
from trainer.graders.settings import grader_settings


@dataclass(frozen=True)
class LayerStatus:
    layer: str          # bubblewrap, landlock, unsafe or none
    reason: str = ""    # why a better layer is not used ("" when bubblewrap works)


def _pyseccomp_loads() -> bool:
    try:
        import pyseccomp  # noqa: F401 - loads libseccomp through ctypes
    except (ImportError, OSError, AttributeError):
        return False
    return True


def _why_not(layer: str) -> str:
    if layer == "bubblewrap" and bwrap_binary() is None:
        return BWRAP_MISSING
    if layer == "landlock" and landlock_abi() < 1:
        return "the kernel has no Landlock"
    if not _pyseccomp_loads():
        return "libseccomp cannot be loaded (apt-get install libseccomp2)"
    failed = self_test(layer)  # '' when a real server on the layer grades a sample
    if failed and os.geteuid() == 0 and unreachable_for_others():
        failed += ("; the sandbox's uid cannot reach the Python installation through "
                   + ", ".join(unreachable_for_others()) + " (chmod o+x them)")
    return failed


@functools.lru_cache(maxsize=1)
def _detect() -> LayerStatus:
    reasons = []
    for layer in ("bubblewrap", "landlock"):
        why = _why_not(layer)
        if not why:
            return LayerStatus(layer, "; ".join(reasons))
        reasons.append(f"{layer}: {why}")
    if grader_settings().unsafe_graders:
        return LayerStatus("unsafe", "; ".join(reasons))
    return LayerStatus("none", "; ".join(reasons))


def layer_status() -> LayerStatus:
    """The layer this process uses and why no better one (detected once per process)."""
    status = _detect()
    if status.layer in ("unsafe", "none"):  # the override is read fresh
        layer = "unsafe" if grader_settings().unsafe_graders else "none"
        status = LayerStatus(layer, status.reason)
    return status


def sandbox_layer() -> str:
    """'bubblewrap', 'landlock', 'unsafe' (operator override) or 'none'."""
    return layer_status().layer


def unavailable_message() -> str:
    why = _detect().reason
    return ("no grader sandbox is available here: python and code graders need bubblewrap "
            "with unprivileged user namespaces (in Docker: security_opt seccomp=unconfined "
            "and apparmor=unconfined on the worker), or a kernel with Landlock and libseccomp, "
            "and the Python installation readable by other users (docs/hardening.md)"
            + (f" ({why})" if why else "")
            + f"; {UNSAFE_ENV}=1 runs them without isolation (unsafe)")


def require_layer() -> str:
    layer = sandbox_layer()
    if layer == "none":
        raise SandboxUnavailable(unavailable_message())
    return layer
