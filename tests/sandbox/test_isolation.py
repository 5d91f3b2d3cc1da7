"""One test per finding of the hostile-tenant review of the sandbox, on both layers: what tenant
code could do to the server, to later requests, to the service and to the host.

Each asserts that the attack fails, that the grading around it (the same batch, the next
batch, another owner's) keeps its true scores, and that nothing of the sandbox is left
running. The API's side (a runtime per call, bounded) is in tests/api/test_grader_tenants.py.
"""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from tests.sandbox.support import LIMITS, attack, check
from trainer.graders import GraderRuntime
from trainer.graders.sandbox.process import processes_with
from trainer.stop import StopRequested

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("layer")]
REPO = Path(__file__).resolve().parents[2]
HONEST = {"type": "python", "name": "honest",
          "source": "def grade(sample, item):\n"
                    "    return 1.0 if sample['output_text'] == item['answer'] else 0.0\n"}
TEXTS, ITEMS = ["right", "wrong", "right"], [{"answer": "right"}] * 3


def python_grader(body: str) -> dict:
    return {"type": "python", "name": "hostile",
            "source": "import os, sys, time, signal, resource\n"
                      "def grade(sample, item):\n" + textwrap.indent(textwrap.dedent(body), "    ")
                      + "\n    return 1.0\n"}


def then_honest(hostile: dict, samples=("ATTACK",)) -> tuple[list, list]:
    """The hostile batch, then an honest batch on the same runtime (the same pool)."""
    tag = "brorl-isolation-" + uuid.uuid4().hex
    with GraderRuntime(pool_size=1, limits=LIMITS, tag=tag) as runtime:
        first = runtime.grade(hostile, list(samples), [{"answer": "right"}] * len(samples))
        later = runtime.grade(HONEST, TEXTS, ITEMS)
    assert processes_with(tag) == [], "a sandbox process outlived the runtime"
    assert [r.reward for r in later] == [1.0, 0.0, 1.0], [r.details for r in later]
    assert not any(r.failed for r in later), [r.details for r in later]
    return first, later


# ------------------------------------------------------------------ 1. owning the server

def test_a_grader_that_rewrites_the_server_does_not_reach_later_requests():
    """(1a) Quietly replace the server's grading function and builtins (later samples score
    0, the server keeps answering): the next request runs in a fresh process."""
    spy = python_grader("""
        import builtins
        main = sys.modules['__main__']
        main._one_python = lambda *a, **k: {'reward': 0.0, 'error': None}
        builtins.float = lambda x=0: 0.0
    """)
    then_honest(spy)


def test_a_forged_reply_frame_is_never_read_as_a_later_reply():
    """(1b) Write reply frames onto every descriptor: the next request still gets its own
    answers, bound to its id."""
    forge = python_grader("""
        import json, struct
        frame = json.dumps({'reward': 1.0, 'error': None, 'id': 'x', 'i': 0}).encode()
        for fd in range(0, 256):
            try:
                os.write(fd, struct.pack('>I', len(frame)) + frame)
            except OSError:
                pass
    """)
    then_honest(forge)


def test_a_raw_thread_does_not_outlive_its_sample():
    """(1c) A thread started through _thread (threading's count misses it) that rewrites
    builtins after its sample: the samples after it in the batch get a fresh process."""
    source = ("import _thread, builtins, time\n"
              "def spy():\n"
              "    time.sleep(0.05)\n"
              "    builtins.float = lambda x=0: 0.0\n"
              "    time.sleep(30)\n"
              "def grade(sample, item):\n"
              "    if sample['output_text'] == 'ATTACK':\n"
              "        _thread.start_new_thread(spy, ())\n"
              "        return 0.5\n"
              "    time.sleep(0.1)\n"
              "    return 1.0 if sample['output_text'] == item['answer'] else 0.0\n")
    grader = {"type": "python", "name": "thread", "source": source}
    tag = "brorl-isolation-" + uuid.uuid4().hex
    with GraderRuntime(pool_size=1, limits=LIMITS, tag=tag) as runtime:
        results = runtime.grade(grader, ["ATTACK"] + TEXTS * 2, [{"answer": "right"}] * 7)
    assert processes_with(tag) == []
    assert [r.reward for r in results] == [0.5] + [1.0, 0.0, 1.0] * 2, \
        [r.details for r in results]


def test_a_grader_cannot_leave_the_server_broken():
    """(1d) Fill /tmp and try chroot: the next request has an empty /tmp and works."""
    breaker = python_grader("""
        try:
            os.chroot('/tmp')
        except OSError as exc:
            print('chroot refused', exc)
        for n in range(1000):  # files of at most RLIMIT_FSIZE until the tmpfs is full
            try:
                with open(f'/tmp/fill{n}', 'wb') as f:
                    while True:
                        f.write(b'x' * 1024 * 1024)
            except OSError as exc:
                if exc.errno != 27:  # EFBIG: this file is full, start another
                    break
    """)
    writer = {"type": "python", "name": "writer",
              "source": "import errno, tempfile\n"
                        "def grade(sample, item):\n"
                        "    try:\n"
                        "        with tempfile.TemporaryFile(dir='/tmp') as f:\n"
                        "            f.write(b'x' * 1024 * 1024)\n"
                        "    except OSError as exc:\n"
                        # The fallback layer has no writable place at all: refused, as ever.
                        "        if exc.errno not in (errno.EACCES, errno.EPERM):\n"
                        "            return 0.0\n"
                        "    return 1.0 if sample['output_text'] == item['answer'] else 0.0\n"}
    tag = "brorl-isolation-" + uuid.uuid4().hex
    with GraderRuntime(pool_size=1, limits=LIMITS, tag=tag) as runtime:
        runtime.grade(breaker, ["ATTACK"], [{}])
        later = runtime.grade(writer, TEXTS, ITEMS)
    assert processes_with(tag) == []
    assert [r.reward for r in later] == [1.0, 0.0, 1.0], [r.details for r in later]


# ------------------------------------------------------------------ 2. the parent and the host

def test_limits_priorities_and_pids_outside_are_out_of_reach():
    """(2) prlimit on the parent (which killed the API and the worker), renicing it,
    real-time scheduling, and probing which host pids exist all fail."""
    before = resource.getrlimit(resource.RLIMIT_CPU)
    results, _ = attack("""
        import resource
        done = []
        for what, call in (
                ('prlimit', lambda: resource.prlimit(os.getppid(), resource.RLIMIT_CPU, (1, 1))),
                ('prlimit 1', lambda: resource.prlimit(1, resource.RLIMIT_NOFILE)),
                ('renice', lambda: os.setpriority(os.PRIO_PROCESS, os.getppid(), 19)),
                ('realtime', lambda: os.sched_setscheduler(0, os.SCHED_FIFO,
                                                           os.sched_param(1)))):
            try:
                call()
                done.append(what)
            except OSError:
                pass
        seen = 0
        for pid in range(1, 5000):
            if pid == os.getpid():
                continue
            try:
                os.getpriority(os.PRIO_PROCESS, pid)
                seen += 1
            except OSError:
                pass
        raise PermissionError(f'done={done} visible={seen}')
    """)
    check(results, contains="done=[] visible=0")
    assert resource.getrlimit(resource.RLIMIT_CPU) == before


# ------------------------------------------------------------------ 3. no root, no capability

@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the probes use x86_64 numbers")
def test_tenant_code_runs_without_root_or_any_capability():
    """(3) Seen from the host while a sample runs: every sandbox process has a uid that is
    not 0 and no capability; inside, calls that need one (reboot, settimeofday, chroot,
    the kernel log, fanotify, fsopen) are refused. Each call is made so that it would change
    nothing even where it is allowed (an invalid reboot command, a NULL time)."""
    probes = python_grader("""
        import ctypes, errno
        libc = ctypes.CDLL(None, use_errno=True)
        if sample['output_text'] == 'SLOW':
            time.sleep(1.5)
            return 1.0
        allowed = []
        # x86_64 numbers: reboot with a bad command (EINVAL where allowed), settimeofday
        # with nothing to set, chroot('/'), syslog's buffer size, fanotify_init, fsopen.
        for name, nr, args in (('reboot', 169, (0xfee1dead, 672274793, 0x0BADC0DE)),
                               ('settimeofday', 164, (None, None)),
                               ('chroot', 161, (b'/',)), ('syslog', 103, (10, None, 0)),
                               ('fanotify_init', 300, (0, 0)), ('fsopen', 430, (b'proc', 0))):
            if libc.syscall(nr, *args) >= 0 or ctypes.get_errno() != errno.EPERM:
                allowed.append(name)
        if allowed:
            raise RuntimeError(f'allowed: {allowed}')
    """)
    tag = "brorl-isolation-" + uuid.uuid4().hex
    seen: list[tuple[int, str]] = []
    with GraderRuntime(pool_size=1, limits=LIMITS, tag=tag) as runtime:
        import threading

        grading = threading.Thread(target=lambda: seen.append(runtime.grade(
            probes, ["PROBE", "SLOW"], [{}, {}])))
        grading.start()
        deadline = time.monotonic() + 20
        found = []
        while grading.is_alive() and time.monotonic() < deadline and len(found) < 2:
            found = processes_with(tag)
            time.sleep(0.05)
        time.sleep(0.5)  # the SLOW sample's child is up by now
        ids = []
        for pid in processes_with(tag):
            try:
                fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status")
                              .read_text().splitlines() if ":" in line)
            except OSError:
                continue
            ids.append((int(fields["Uid"].split()[0]), fields["CapEff"].strip(),
                        fields["CapPrm"].strip()))
        grading.join()
    assert processes_with(tag) == []
    probe, slow = seen[0]
    assert probe.reward == 1.0 and not probe.failed, probe.details
    assert slow.reward == 1.0
    assert len(ids) >= 2, ids  # the server and the sample's process at least
    # bwrap itself keeps the caller's uid only outside its namespace: it too is not root.
    assert all(uid != 0 and eff == "0000000000000000" and prm == "0000000000000000"
               for uid, eff, prm in ids), ids


# ------------------------------------------------------------------ 4-7

CODE = {"type": "code", "name": "add", "timeout_s": 1.0}
ADD = "```python\ndef add(a, b):\n    return a + b\n```"
ADD_TESTS = {"tests": ["assert add(2, 2) == 4", "assert add(1, 0) == 1"]}


def test_a_program_cannot_lower_its_servers_limits():
    """(4) A generated program sets RLIMIT_DATA on its parent server: refused, and the
    programs after it (same server) still run."""
    cheat = ("```python\nimport os, resource\n"
             "resource.prlimit(os.getppid(), resource.RLIMIT_DATA, (1 << 20, 1 << 20))\n"
             "def add(a, b):\n    return a + b\n```")
    tag = "brorl-isolation-" + uuid.uuid4().hex
    with GraderRuntime(pool_size=1, limits=LIMITS, tag=tag) as runtime:
        first = runtime.grade(CODE, [cheat, ADD, ADD], [ADD_TESTS] * 3)
        later = runtime.grade(CODE, [ADD] * 3, [ADD_TESTS] * 3)
    assert processes_with(tag) == []
    assert first[0].reward == 0.0 and "PermissionError" in first[0].details, first[0].details
    assert [r.reward for r in first[1:] + later] == [1.0] * 5, [r.details for r in later]


def test_dev_is_minimal_and_read_only():
    """(5) /dev/shm was a writable tmpfs of half the RAM outside every cap."""
    results, _ = attack("""
        wrote = []
        for path in ('/dev/shm/x', '/dev/x', '/dev/mqueue/x'):
            try:
                with open(path, 'wb') as f:
                    f.write(b'x' * 1024 * 1024)
                wrote.append(path)
            except OSError:
                pass
        try:
            extra = sorted(set(os.listdir('/dev')) - {'null', 'zero', 'full', 'random',
                                                       'urandom', 'fd'})
        except OSError:
            extra = []
        raise PermissionError(f'wrote={wrote} extra={extra}')
    """)
    check(results, contains="wrote=[] extra=[]")


def test_threads_are_capped_even_when_the_service_is_root():
    """(7) RLIMIT_NPROC was not enforced for a sandbox that was root outside (529 threads
    started under a limit of 64, until the address space ran out)."""
    results, _ = attack("""
        import threading
        threading.stack_size(64 * 1024)  # so that the address-space limit is not what stops them
        started = 0
        try:
            for started in range(1000):
                threading.Thread(target=time.sleep, args=(5,), daemon=True).start()
        except RuntimeError as exc:
            raise RuntimeError(f'started={started}: {exc}')
    """)
    check(results, contains="can't start new thread")
    started = int(results[2].details.split("started=")[1].split(":")[0])
    assert started <= LIMITS.processes, started


# ------------------------------------------------------------------ time and cancel

def test_a_code_graders_tests_share_the_operators_per_sample_bound():
    """Six tests of 1 s each against a 2 s per-sample limit: the program is stopped near
    2 s, not after 6 (it was timeout x tests)."""
    spin = "```python\ndef add(a, b):\n    while True:\n        pass\n```"
    tag = "brorl-isolation-" + uuid.uuid4().hex
    with GraderRuntime(pool_size=1, limits=LIMITS, tag=tag) as runtime:
        start = time.monotonic()
        (result,) = runtime.grade(CODE, [spin], [{"tests": ["assert add(1, 1) == 2"] * 6}])
        took = time.monotonic() - start
    assert result.reward == 0.0
    assert took < 5.0, took


def test_a_stop_ends_grading_within_seconds():
    """A cancel (the trainer's stop check raising) kills the sandboxes mid-batch."""
    sleeper = python_grader("time.sleep(100)")
    tag = "brorl-isolation-" + uuid.uuid4().hex
    limits = type(LIMITS)(**{**LIMITS.__dict__, "timeout_s": 120.0})
    asked = time.monotonic() + 1.0
    cancelled = [True]

    def stop_check() -> None:
        if cancelled[0] and time.monotonic() > asked:
            raise StopRequested

    with GraderRuntime(pool_size=2, limits=limits, tag=tag, stop_check=stop_check) as runtime:
        with pytest.raises(StopRequested):
            runtime.grade(sleeper, ["x"] * 8, [{}] * 8)
        stopped = time.monotonic() - asked
        assert processes_with(tag) == []
        cancelled[0] = False  # the runtime grades again once the stop is over
        assert [r.reward for r in runtime.grade(HONEST, TEXTS, ITEMS)] == [1.0, 0.0, 1.0]
    assert stopped < 3.0, stopped


def test_no_server_outlives_its_service(layer, tmp_path):
    """SIGKILL the process that owns a busy sandbox: every sandbox process goes too."""
    tag = "brorl-orphan-" + uuid.uuid4().hex
    script = tmp_path / "owner.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from trainer.graders import GraderRuntime
        from trainer.graders.sandbox import detect
        detect._detect = lambda: detect.LayerStatus({layer!r})
        grader = {{"type": "python", "name": "s", "source":
                   "import time\\ndef grade(s, i):\\n    time.sleep(100)\\n    return 1.0\\n"}}
        with GraderRuntime(pool_size=2, tag={tag!r}) as runtime:
            runtime.grade(grader, ["x"] * 4, [{{}}] * 4)
    """))
    owner = subprocess.Popen([sys.executable, str(script)])
    try:
        deadline = time.monotonic() + 30
        while len(processes_with(tag)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(processes_with(tag)) >= 4, "the sandboxes did not start"
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    deadline = time.monotonic() + 5
    while processes_with(tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(tag) == []
