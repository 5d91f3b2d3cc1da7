"""How a grader sandbox is started on an isolation layer: its command line, limits and uid.

Which layer works here is detected in detect.py (it starts real servers: process.py); this
module knows nothing of detection, so both import it and it imports neither.

Threat model (docs/hardening.md, "Tenant code"): a grader, a generated program or a tool is
hostile. It must not see, change or stop anything outside its own sandbox: another tenant's
grading, the service, the host. Every layer runs the sandbox
- as an unprivileged uid of its own when the service is root (one uid per sandbox, taken from
  BRORL_SANDBOX_UID_BASE's range, so RLIMIT_NPROC counts that sandbox alone and no two
  sandboxes share an identity), never as root and with no capability;
- with no new privileges, an empty environment and rlimits;
- with tenant code only in short-lived children of the server, each locked down by an
  allow-list seccomp filter (server.py) whose process-directed calls (kill, prlimit, priority,
  scheduling) reach the calling process alone.
Layers, best first:
- "bubblewrap": `bwrap` (found wherever the operator installed it) in fresh user, pid, network,
  IPC, UTS and cgroup namespaces: no network, a filesystem of read-only binds of the Python
  installation, a read-only /dev of null/zero/full/random/urandom, a size-capped private /tmp
  as the only writable place, a new session, death with its parent.
- "landlock": for containers without user namespaces. Landlock confines the server to reading
  the Python installation (nothing writable, no TCP, no signals outside); there is no private
  /tmp and no pid namespace: the seccomp filter's self-only rules stand in for it.
- "unsafe": no layer meets the bar and the operator set BRORL_UNSAFE_GRADERS=1: the same uid
  drop, rlimits and filter, but the files the sandbox uid can read are readable. Unsafe.
- "none": anything that needs a sandbox is refused (SandboxUnavailable), and /readyz says why.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import site
import stat
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from trainer.graders.settings import grader_settings

SERVER = Path(__file__).with_name("server.py")
SANDBOX_DIR = "/sandbox"  # this folder (the server, its modules, confine.py), read-only
SANDBOX_SERVER = f"{SANDBOX_DIR}/server.py"
UNSAFE_ENV = "BRORL_UNSAFE_GRADERS"
UID_RANGE = 65536
# Native libraries start no thread pools of their own (each thread counts against the
# sandbox's process limit, and graders are single-threaded work).
THREAD_ENV = {name: "1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                     "MKL_NUM_THREADS", "NUMEXPR_MAX_THREADS")}
BWRAP_DIRS = ("/usr/local/bin", "/usr/bin", "/bin", "/usr/local/sbin", "/usr/sbin")
DEVICES = ("null", "zero", "full", "random", "urandom")
BWRAP_MISSING = "bubblewrap is not installed (apt-get install bubblewrap, or BRORL_BWRAP_PATH)"


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
    timeout_s: float = 120.0        # the operator's per-sample bound: every program and call

    @classmethod
    def from_env(cls) -> "Limits":
        """The operator's limits (BRORL_GRADER_MEMORY_MB, _TMP_MB, _OUTPUT_KB, _TIMEOUT_S)."""
        cfg = grader_settings()
        return cls(memory_bytes=cfg.grader_memory_mb * 1024**2,
                   tmp_bytes=cfg.grader_tmp_mb * 1024**2,
                   output_bytes=cfg.grader_output_kb * 1024, timeout_s=cfg.grader_timeout_s)

    def server_config(self) -> dict:
        return {"memory_bytes": self.memory_bytes, "output_bytes": self.output_bytes,
                "file_bytes": self.file_bytes, "processes": self.processes}


# ------------------------------------------------------------------ who the sandbox runs as

_uids_lock = threading.Lock()
_uids_in_use: set[int] = set()


def take_uid() -> int | None:
    """A uid of its own for one sandbox when this service is root; None otherwise (a
    non-root service cannot change uid: its sandboxes run as itself, held by the filter)."""
    if os.geteuid() != 0:
        return None
    base = grader_settings().sandbox_uid_base
    with _uids_lock:
        while True:
            uid = base + random.randrange(UID_RANGE)
            if uid not in _uids_in_use:
                _uids_in_use.add(uid)
                return uid


def release_uid(uid: int | None) -> None:
    with _uids_lock:
        _uids_in_use.discard(uid)


def _tasks_of_uid(uid: int) -> int:
    """Threads the uid runs now: RLIMIT_NPROC counts them with the sandbox's own."""
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            total += int(fields.get("Threads", "1"))
    return total


def process_limit(limits: Limits, uid: int | None) -> int:
    """RLIMIT_NPROC for a sandbox: its own processes and threads when it has a uid of its
    own; on a non-root service (shared uid) the service's current count is added."""
    return limits.processes if uid is not None else limits.processes + _tasks_of_uid(os.getuid())


# ------------------------------------------------------------------ command lines

def bwrap_binary() -> str | None:
    """bubblewrap's absolute path: BRORL_BWRAP_PATH, else PATH and the usual folders."""
    configured = grader_settings().bwrap_path
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    search = os.pathsep.join([os.environ.get("PATH", ""), *BWRAP_DIRS])
    return shutil.which("bwrap", path=search)


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


def unreachable_for_others() -> list[str]:
    """Folders on the way to the Python installation or the server that a uid other than
    their owner cannot pass (a sandbox uid cannot start from there): `chmod o+x` them."""
    targets = _python_paths() + [str(SERVER.parent)]
    out = []
    for target in targets:
        path = Path(target)
        for folder in [*reversed(path.parents), path]:
            try:
                mode = folder.stat().st_mode
            except OSError:
                continue
            if not mode & stat.S_IXOTH and str(folder) not in out:
                out.append(str(folder))
    return out


def bwrap_command(limits: Limits, bwrap: str = "bwrap") -> list[str]:
    cmd = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
           "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp",
           "--setenv", "LANG", "C.UTF-8", "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
           "--uid", "65534", "--gid", "65534", "--hostname", "sandbox",
           "--ro-bind", "/usr", "/usr"]
    for name, value in THREAD_ENV.items():
        cmd += ["--setenv", name, value]
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
    # A /dev of the harmless character devices only, read-only: bwrap's --dev adds a
    # writable /dev/shm (half of RAM, outside the /tmp cap) and a pty multiplexer.
    cmd += ["--proc", "/proc", "--size", "65536", "--tmpfs", "/dev"]
    for name in DEVICES:
        cmd += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
    cmd += ["--symlink", "/proc/self/fd", "/dev/fd", "--remount-ro", "/dev",
            "--ro-bind", str(SERVER.parent), SANDBOX_DIR, "--chdir", "/tmp",
            # bwrap's root is a writable tmpfs (it holds the mount points): make it
            # read-only, so /tmp is the one writable place.
            "--remount-ro", "/"]
    return cmd


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where there is none."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return max(0, int(libc.syscall(444, None, 0, 1)))  # LANDLOCK_CREATE_RULESET_VERSION
    except (OSError, AttributeError):
        return 0


def landlock_reads() -> list[str]:
    """What the landlock layer may read: libraries, the Python installation, the server."""
    reads = ["/usr", str(SERVER.parent)] + _python_paths()
    for name in ("/lib", "/lib64", "/lib32", "/bin", "/etc/ld.so.cache"):
        if os.path.exists(name):
            reads.append(os.path.realpath(name))
    return sorted(set(reads))


def server_command(layer: str, mode: str, limits: Limits, uid: int | None = None) -> list[str]:
    """argv that starts a server in `mode` under `layer`, for a sandbox running as `uid`."""
    python = [sys.executable, "-I", "-B"]
    config = {**limits.server_config(), "nproc": process_limit(limits, uid)}
    if layer == "bubblewrap":
        bwrap = bwrap_binary()
        if bwrap is None:  # removed since detection found it
            raise SandboxUnavailable(BWRAP_MISSING)
        config["private_tmp"] = True
        return bwrap_command(limits, bwrap) + python + [SANDBOX_SERVER, mode, json.dumps(config)]
    # No bwrap between: the server itself dies with this process (checked at its start).
    config["parent"] = os.getpid()
    if layer == "landlock":
        config["landlock"] = landlock_reads()
        return python + [str(SERVER), mode, json.dumps(config)]
    if layer == "unsafe":
        return python + [str(SERVER), mode, json.dumps(config)]
    # Callers pass a detected layer (detect.require_layer refuses "none" with the reason).
    raise SandboxUnavailable(f"no grader sandbox runs on the layer {layer!r}")


def server_env(layer: str) -> dict[str, str]:
    # bwrap clears the environment itself (--clearenv, --setenv); the others get this one.
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp", **THREAD_ENV}
