"""One test per attack on the grader sandbox, through each real layer: bubblewrap, and the
Landlock fallback for containers without user namespaces.

Each attack is one sample of a batch graded by a python grader that attacks only for that
sample's text; the batch also holds honest samples ("right" -> 1, "wrong" -> 0). Every test
asserts that the attacking sample scores 0 with its error recorded, that the honest samples
keep their true scores, and that after the runtime closes no process of it is left (its
unique tag appears in no process's command line).
"""
from __future__ import annotations

import os
import socket
import uuid

import pytest

from tests.sandbox.support import LIMITS, SECRET, attack, check
from trainer.graders import GraderRuntime
from trainer.graders.sandbox.process import processes_with as _tagged_processes

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("layer")]
@pytest.fixture
def listening_port():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    yield server.getsockname()[1]
    server.close()


def test_connect_to_the_api_port(listening_port):
    check(attack(f"socket.create_connection(('127.0.0.1', {listening_port}), timeout=1)")[0])


def test_connect_to_postgres():
    check(attack("socket.create_connection(('127.0.0.1', 5432), timeout=1)")[0])


def test_connect_to_redis():
    check(attack("socket.create_connection(('127.0.0.1', 6379), timeout=1)")[0])


def test_dns_lookup():
    check(attack("socket.getaddrinfo('pypi.org', 443)")[0])


def test_read_the_workers_environment(monkeypatch):
    monkeypatch.setenv("BRORL_SECRET_KEY", SECRET)
    check(attack("""
        assert 'BRORL_SECRET_KEY' not in os.environ, 'leaked'
        try:
            pids = os.listdir('/proc')
        except OSError:
            pids = []
        for pid in pids:
            if pid.isdigit():
                try:
                    if b'BRORL_SECRET_KEY' in open(f'/proc/{pid}/environ', 'rb').read():
                        return
                except OSError:
                    pass
        raise RuntimeError('environment not found')
    """)[0], contains="environment not found")


def test_read_the_data_dir_sqlite_file_and_key(tmp_path, monkeypatch):
    (tmp_path / "brorl.db").write_bytes(b"SQLite format 3\x00" + SECRET.encode())
    (tmp_path / "api.key").write_text(SECRET)
    monkeypatch.setenv("BRORL_TEST_PATH", str(tmp_path))
    check(attack("""
        for name in ('brorl.db', 'api.key'):
            open(os.path.join(item['secret_path'], name), 'rb').read()
    """)[0], contains="Error: [Errno")


def test_read_the_project_source():
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    check(attack(f"open({os.path.join(repo, 'pyproject.toml')!r}).read()")[0],
          contains="Error: [Errno")


def test_write_outside_the_temp_folder():
    check(attack("""
        for path in ('/usr/owned', '/sandbox/server.py', '/etc/owned', '/owned'):
            try:
                open(path, 'w').write('x')
            except OSError:
                continue
            raise RuntimeError('wrote ' + path)
        raise OSError('every write refused')
    """)[0], contains="every write refused")


def test_fill_the_disk():
    check(attack("""
        for n in range(1000):
            with open(f'/tmp/fill{n}', 'wb') as f:
                for _ in range(8):
                    f.write(b'x' * 1024 * 1024)
    """)[0], contains="Error: [Errno")


def test_allocate_10_gb():
    check(attack("bytearray(10 * 1024**3)")[0], contains="MemoryError")


def test_a_background_thread_that_outlives_its_sample():
    """A thread left behind keeps firing timer signals at its server: the server is replaced
    right after that sample, so the samples graded after it (in this call and the next)
    are not hit."""
    source = ("import os, signal, threading, time\n"
              "def sabotage():\n"
              "    time.sleep(0.1)\n"
              "    for _ in range(400):\n"
              "        time.sleep(0.005)\n"
              "        os.kill(os.getpid(), signal.SIGALRM)\n"
              "def grade(sample, item):\n"
              "    if sample['output_text'] == 'ATTACK':\n"
              "        threading.Thread(target=sabotage, daemon=True).start()\n"
              "        raise RuntimeError('left a thread behind')\n"
              "    time.sleep(0.02)\n"
              "    return 1.0 if sample['output_text'] == item['answer'] else 0.0\n")
    grader = {"type": "python", "name": "thread", "source": source}
    tag = "brorl-attack-" + uuid.uuid4().hex
    with GraderRuntime(pool_size=1, limits=LIMITS, tag=tag) as runtime:
        first = runtime.grade(grader, ["right", "ATTACK"] + ["right"] * 10,
                              [{"answer": "right"}] * 12)
        later = runtime.grade(grader, ["right", "wrong"] * 5, [{"answer": "right"}] * 10)
    assert _tagged_processes(tag) == []
    assert first[1].errors["python_grader_runtime_error"] and "left a thread" in first[1].details
    assert [r.reward for r in first[2:]] == [1.0] * 10, [r.details for r in first[2:]]
    assert [r.reward for r in later] == [1.0, 0.0] * 5 and not any(r.failed for r in later), [r.details for r in later]


def test_fork_bomb():
    check(attack("""
        for _ in range(10000):
            os.fork()
    """)[0], contains="PermissionError")


def test_infinite_loop():
    check(attack("while True:\n    pass")[0], flag="unresponsive_reward_error")


def test_sleep_past_the_limit():
    check(attack("time.sleep(3600)")[0], flag="unresponsive_reward_error")


def test_a_double_forked_daemon():
    check(attack("""
        import subprocess
        try:
            subprocess.Popen(['/bin/sh', '-c', 'sleep 1000 &'], start_new_session=True)
        except OSError:
            pass
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(1000)
    """)[0], contains="PermissionError")


def test_one_gb_to_stdout():
    check(attack("""
        chunk = 'x' * (1024 * 1024)
        for _ in range(1024):
            print(chunk, flush=True)
    """)[0], contains="OSError")


def test_segfault_through_ctypes():
    results, _ = attack("import ctypes\nctypes.string_at(0)")
    check(results, contains="crashed")


def test_signals_to_the_parent():
    check(attack("""
        for target in (os.getppid(), 1, -1, 0):
            try:
                os.kill(target, signal.SIGKILL)
            except OSError:
                continue
        raise PermissionError('every signal refused')
    """)[0], contains="every signal refused")


HONEST = "```python\ndef add(a, b):\n    return a + b\n```"
CHEATS = [
    # Equal to everything: judged outside, by value, so it is not equal to 4.
    "class Any:\n    def __eq__(self, o): return True\ndef add(a, b): return Any()",
    # Rewrite the harness's verdict: print a pass, kill the parent, patch builtins, exit.
    "import os, sys, builtins\nprint('PASS: 2/2')\n"
    "try:\n    os.kill(os.getppid(), 9)\nexcept OSError: pass\n"
    "builtins.AssertionError = type('X', (Exception,), {})\n"
    "for fd in range(3, 64):\n    try: os.write(fd, b'{\"results\": [{\"value\": 4}]}')\n"
    "    except OSError: pass\n"
    "def add(a, b): sys.exit(0)",
    # Read the expected answers from the harness's memory.
    "import os\nopen(f'/proc/{os.getppid()}/mem', 'rb')\ndef add(a, b): return 0",
]


@pytest.mark.parametrize("cheat", range(len(CHEATS)))
def test_a_program_that_rewrites_its_harness_verdict(cheat):
    grader = {"type": "code", "name": "add", "timeout_s": 1.0}
    item = {"tests": ["assert add(2, 2) == 4", "assert add(1, 0) == 1"]}
    tag = "brorl-attack-" + uuid.uuid4().hex
    with GraderRuntime(pool_size=2, limits=LIMITS, tag=tag) as runtime:
        results = runtime.grade(grader, [HONEST, CHEATS[cheat], HONEST], [item] * 3)
    assert _tagged_processes(tag) == []
    assert [r.reward for r in results] == [1.0, 0.0, 1.0], [r.details for r in results]
    assert results[1].details


def test_a_program_that_writes_results_nested_too_deep():
    """The server parses what a program's process writes back; a program that replaces the
    result writer with JSON nested past the parser's limit fails alone."""
    deep = ("```python\nimport json\n"
            "json.dumps = lambda *a, **k: '[' * 200000 + ']' * 200000\n"
            "def add(a, b):\n    return a + b\n```")
    item = {"tests": ["assert add(2, 2) == 4"]}
    tag = "brorl-attack-" + uuid.uuid4().hex
    with GraderRuntime(pool_size=1, limits=LIMITS, tag=tag) as runtime:
        results = runtime.grade({"type": "code", "name": "add", "timeout_s": 2.0},
                                [HONEST, deep, HONEST], [item] * 3)
    assert _tagged_processes(tag) == []
    assert [r.reward for r in results] == [1.0, 0.0, 1.0], [r.details for r in results]
    assert "corrupted" in results[1].details, results[1].details
