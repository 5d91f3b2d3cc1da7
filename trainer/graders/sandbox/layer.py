"""Which isolation layer grader sandboxes use here, and the command line that starts one.

Layers, best first:
- "bubblewrap": Debian's `bwrap` in fresh user, pid, network, IPC, UTS and cgroup
  namespaces: no network at all (not even 127.0.0.1), a filesystem of read-only binds of
  the Python installation only (no data dir, database, artifacts or keys), an empty
  environment, a size-capped private tmpfs as the only writable place, a new session (no
  TIOCSTI), all capabilities dropped, and death with its parent (the pid namespace takes
  every process in it down). Inside, the runner adds rlimits and a seccomp filter.
- "landlock": for containers without user namespaces. The runner starts with an empty
  environment and restricts itself with Landlock (read-only access to the Python
  installation and libraries, nothing writable, no TCP, no signals outside), rlimits and a
  seccomp filter that also forbids every socket. There is no private /tmp (graders cannot
  write files) and no pid namespace (the filter forbids creating processes instead).
- "unsafe": no isolation layer works here and the operator set BRORL_UNSAFE_GRADERS=1. The
  runner still runs with an empty environment, rlimits and the seccomp filter (no sockets,
  no fork/exec), but it can read whatever the worker's user can read. Documented as unsafe.
- "none": nothing meets the bar; anything that needs a sandbox is refused (SandboxUnavailable).
Both real layers are verified by the same attack tests (tests/sandbox/).
`sandbox_layer()` probes once per process (a real bwrap start) and is what /readyz and the
worker's start log report.
"""
from __future__ import annotations

import ctypes
import functools
import json
import os
import shutil
import site
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from trainer.graders.settings import grader_settings

RUNNER = Path(__file__).with_name("runner.py")
SANDBOX_RUNNER = "/sandbox/runner.py"
UNSAFE_ENV = "BRORL_UNSAFE_GRADERS"


class SandboxUnavailable(RuntimeError):
    """No isolation layer that meets the bar is available here."""


@dataclass(frozen=True)
class Limits:
    """Per-sandbox bounds (OpenAI's defaults: 2 GB memory, 2 minutes a call)."""

    memory_bytes: int = 2 * 1024**3
    tmp_bytes: int = 256 * 1024**2
    output_bytes: int = 1024**2     # what one program may print (code graders)
    file_bytes: int = 64 * 1024**2  # RLIMIT_FSIZE: any one file, grader stdout included
    processes: int = 64
    timeout_s: float = 120.0

    @classmethod
    def from_env(cls) -> "Limits":
        """The operator's limits (BRORL_GRADER_MEMORY_MB, _TMP_MB, _OUTPUT_KB, _TIMEOUT_S)."""
        cfg = grader_settings()
        return cls(memory_bytes=cfg.grader_memory_mb * 1024**2,
                   tmp_bytes=cfg.grader_tmp_mb * 1024**2,
                   output_bytes=cfg.grader_output_kb * 1024, timeout_s=cfg.grader_timeout_s)

    def runner_json(self) -> str:
        return json.dumps({"memory_bytes": self.memory_bytes, "output_bytes": self.output_bytes,
                           "file_bytes": self.file_bytes, "processes": self.processes})


def _python_paths() -> list[str]:
    """Folders the interpreter and its packages live in (bound read-only, nothing else)."""
    paths = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}
    paths |= {os.path.realpath(p) for p in site.getsitepackages() if os.path.isdir(p)}
    exe = os.path.realpath(sys.executable)
    paths.add(os.path.dirname(os.path.dirname(exe)))
    # Drop paths under another bound path, and /usr (bound as a whole below).
    out = []
    for path in sorted(paths):
        if path == "/usr" or path.startswith("/usr/"):
            continue
        if not any(path.startswith(p.rstrip("/") + "/") for p in out):
            out.append(path)
    return out


def bwrap_command(limits: Limits) -> list[str]:
    cmd = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
           "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp",
           "--setenv", "LANG", "C.UTF-8", "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
           "--uid", "65534", "--gid", "65534", "--hostname", "sandbox",
           "--ro-bind", "/usr", "/usr"]
    for name in ("lib", "lib64", "lib32", "bin", "sbin"):
        if os.path.islink(f"/{name}"):
            cmd += ["--symlink", os.readlink(f"/{name}"), f"/{name}"]
        elif os.path.isdir(f"/{name}"):
            cmd += ["--ro-bind", f"/{name}", f"/{name}"]
    if os.path.exists("/etc/ld.so.cache"):  # lets ctypes find libseccomp
        cmd += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    # /tmp first: bwrap mounts in order, so an interpreter installed under /tmp (a venv in a
    # clone there) is bound on top of the fresh tmpfs instead of hidden by it.
    cmd += ["--size", str(limits.tmp_bytes), "--tmpfs", "/tmp"]
    for path in _python_paths():
        cmd += ["--ro-bind", path, path]
    cmd += ["--proc", "/proc", "--dev", "/dev",
            "--ro-bind", str(RUNNER), SANDBOX_RUNNER, "--chdir", "/tmp",
            # bwrap's root is a writable tmpfs (it holds the mount points): make it
            # read-only, so /tmp is the one writable place.
            "--remount-ro", "/"]
    return cmd


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where there is none."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return max(0, int(libc.syscall(444, None, 0, 1)))  # LANDLOCK_CREATE_RULESET_VERSION
    except (OSError, AttributeError):
        return 0


def landlock_reads() -> list[str]:
    """What the landlock layer may read: libraries, the Python installation, the runner."""
    reads = ["/usr", str(RUNNER.parent)] + _python_paths()
    for name in ("/lib", "/lib64", "/lib32", "/bin", "/etc/ld.so.cache"):
        if os.path.exists(name):
            reads.append(os.path.realpath(name))
    return sorted(set(reads))


def runner_command(layer: str, mode: str, limits: Limits) -> list[str]:
    """argv that starts a runner in `mode` under `layer`."""
    python = [sys.executable, "-I", "-B"]
    if layer == "bubblewrap":
        return bwrap_command(limits) + python + [SANDBOX_RUNNER, mode, limits.runner_json()]
    if layer == "landlock":
        config = json.loads(limits.runner_json())
        config["landlock"] = landlock_reads()
        return python + [str(RUNNER), mode, json.dumps(config)]
    if layer == "unsafe":
        return python + [str(RUNNER), mode, limits.runner_json()]
    raise SandboxUnavailable(unavailable_message())


def runner_env(layer: str) -> dict[str, str]:
    # bwrap clears the environment itself; the unsafe layer gets the same empty one.
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"} if layer != "bubblewrap" else {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def _bwrap_works() -> bool:
    if shutil.which("bwrap") is None:
        return False
    probe = bwrap_command(Limits()) + [sys.executable, "-I", "-c", "import pyseccomp"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=30, env=runner_env("bwrap"))
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@functools.lru_cache(maxsize=1)
def _pyseccomp_loads() -> bool:
    try:
        import pyseccomp  # noqa: F401 - loads libseccomp through ctypes
    except (ImportError, OSError, AttributeError):
        return False
    return True


@functools.lru_cache(maxsize=1)
def _probe() -> bool:
    return _bwrap_works()


def sandbox_layer() -> str:
    """'bubblewrap', 'landlock', 'unsafe' (operator override, no isolation) or 'none'."""
    if _probe():
        return "bubblewrap"
    if landlock_abi() >= 1 and _pyseccomp_loads():
        return "landlock"
    if grader_settings().unsafe_graders:
        return "unsafe"
    return "none"


def unavailable_message() -> str:
    return ("no grader sandbox is available here: python and code graders need bubblewrap "
            "(`apt-get install bubblewrap`) with unprivileged user namespaces (in Docker: "
            "security_opt seccomp=unconfined and apparmor=unconfined on the worker), or a "
            "kernel with Landlock and libseccomp; "
            f"{UNSAFE_ENV}=1 runs them without isolation (unsafe)")


def require_layer() -> str:
    layer = sandbox_layer()
    if layer == "none":
        raise SandboxUnavailable(unavailable_message())
    return layer
