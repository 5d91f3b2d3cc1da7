"""The built-in tools environment against the real sandbox, through each real layer
(bubblewrap, and the Landlock fallback): a call returns its result, state stays with its
trajectory, and each hostile call (the interpreter's code or a tenant's own tool function
that raises, hangs, prints megabytes, forks, reads another tenant's files, opens a socket)
answers the model with an error while the episode carries on; after close() no process of
the environment is left (its unique tag appears in no process's command line)."""
from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from types import SimpleNamespace

import pytest

from tests.sandbox.support import LIMITS, SECRET
from trainer.graders.sandbox.process import processes_with
from trainer.rollouts.environments.base import AssistantTurn, EnvReply, ToolCall
from trainer.rollouts.environments.tools_env import MAX_CONTENT_CHARS, build
from trainer.tasks.base import Example

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("layer")]

TOOLS = '''
import os, random

NOTES = []

def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b

def note(text: str) -> str:
    """Keep a note; returns every note of this conversation so far."""
    NOTES.append(text)
    return ", ".join(NOTES)

def draw() -> int:
    """A random number."""
    return random.randrange(10**9)

def boom(message: str) -> str:
    """Always raises."""
    raise ValueError(message)

def read(path: str) -> str:
    """Read a file."""
    return open(path).read()

def _reward(messages):
    return float(len(NOTES))

def spin(n: int) -> int:
    """Counts forever."""
    while True:
        n += 1

def chatter(megabytes: int) -> str:
    """Prints megabytes."""
    print("x" * (megabytes * 1024 * 1024))
    return "said"

def spawn(seconds: int) -> str:
    """Leaves a child behind that outlives the call."""
    if os.fork() == 0:
        import time
        time.sleep(seconds)
        os._exit(0)
    return "spawned"
'''


class Env:
    """An environment under a unique tag; `turn` runs calls of several episodes at once."""

    def __init__(self, sandboxes: int = 2, **spec):
        self.tag = "brorl-tools-test-" + uuid.uuid4().hex
        self.env = build({"tools": TOOLS, "code_interpreter": True, "tool_timeout_s": 1.0,
                          "reward": "grader", **spec}, settings=SimpleNamespace(tool_sandboxes=sandboxes),
                         tag=self.tag)
        self.env.limits = LIMITS
        self.env.pool.limits = LIMITS

    def episode(self, sample=0):
        return self.env.episode(Example("q", "a"), sample)

    def turn(self, *pairs) -> list[EnvReply]:
        """pairs: (episode, [(name, arguments), ...]); the episodes' steps run together."""
        async def run():
            return await asyncio.gather(*(
                episode.step(AssistantTurn("", [ToolCall(f"c{n}", name, args)
                                                for n, (name, args) in enumerate(calls)]))
                for episode, calls in pairs))
        return asyncio.run(run())

    def close(self):
        self.env.close()
        assert processes_with(self.tag) == [], "a sandbox process outlived the environment"


@pytest.fixture
def tools():
    env = Env()
    yield env
    env.close()


def content(reply: EnvReply, n: int = 0) -> str:
    return reply.messages[n]["content"]


def test_a_call_returns_its_result_and_the_code_interpreter_keeps_its_variables(tools):
    a = tools.episode()
    first, = tools.turn((a, [("add", {"a": 2, "b": 40}),
                             ("python", {"code": "import math\nx = 6 * 7\nprint('hi')\nx + 1"})]))
    assert [content(first, 0), content(first, 1)] == ["42", "hi\n43\n"]
    assert (first.tool_calls, first.tool_errors, first.done) == (2, 0, False)
    assert first.messages[1] == {"role": "tool", "tool_call_id": "c1", "name": "python",
                                 "content": "hi\n43\n"}
    second, = tools.turn((a, [("python", {"code": "print(math.sqrt(x - 6))"})]))
    assert content(second) == "6.0\n"


def test_state_stays_with_its_trajectory(tools, layer):
    a, b = tools.episode(0), tools.episode(1)
    r1 = tools.turn((a, [("note", {"text": "a1"}), ("python", {"code": "v = 'A'"})]),
                    (b, [("note", {"text": "b1"}), ("python", {"code": "v = 'B'"})]))
    assert [content(r, 0) for r in r1] == ["a1", "b1"]
    r2 = tools.turn((a, [("note", {"text": "a2"}), ("python", {"code": "print(v)"})]),
                    (b, [("note", {"text": "b2"}), ("python", {"code": "print(v)"})]))
    assert [content(r2[0], 0), content(r2[0], 1)] == ["a1, a2", "A\n"]
    assert [content(r2[1], 0), content(r2[1], 1)] == ["b1, b2", "B\n"]
    if layer == "bubblewrap":  # the Landlock layer has nothing writable at all
        # A file one trajectory wrote is its own: the other never sees it.
        tools.turn((a, [("python", {"code": "open('/tmp/f', 'w').write('A')"})]))
        r3 = tools.turn((a, [("python", {"code": "print(open('/tmp/f').read())"})]),
                        (b, [("python", {"code": "import os\nprint(os.path.exists('/tmp/f'))"})]))
        assert [content(r3[0]), content(r3[1])] == ["A\n", "False\n"]
    # Random draws replay: a later call sees the same earlier numbers.
    d1, = tools.turn((a, [("python", {"code": "import random\nr = random.random()\nr"})]))
    d2, = tools.turn((a, [("python", {"code": "r"})]))
    assert content(d1) == content(d2)
    assert asyncio.run(a.finish([])) is None  # reward: grader (the default)


def test_a_call_holds_no_other_call_of_its_batch():
    """One sandbox, so both trajectories' calls are one request to one server: the first
    call's child finds nothing of the second (a sibling trajectory's arguments) in memory
    the garbage collector reaches."""
    tools = Env(sandboxes=1)
    try:
        a, b = tools.episode(0), tools.episode(1)
        tools.turn((a, [("add", {"a": 1, "b": 1})]), (b, [("note", {"text": "secret-b"})]))
        spy = ("import gc\nprint(sum(1 for o in gc.get_objects() if isinstance(o, dict)"
               " and o.get('arguments') in ({'text': 'secret-b'}, {'text': 'b2'})))")
        replies = tools.turn((a, [("python", {"code": spy})]), (b, [("note", {"text": "b2"})]))
    finally:
        tools.close()
    assert [content(r) for r in replies] == ["0\n", "secret-b, b2"]


def test_the_calls_of_one_turn_run_concurrently():
    tools = Env(sandboxes=4, tool_timeout_s=10.0)
    try:
        episodes = [tools.episode(n) for n in range(4)]
        tools.turn(*((e, [("add", {"a": 1, "b": 1})]) for e in episodes))  # servers started
        start = time.monotonic()
        # Calls of 3 s (no CPU): one by one they take 12 s; together 3 s plus the turn's
        # forks and replays, which the full suite's load on 2 cores stretched to 2.2 s.
        replies = tools.turn(*((e, [("python", {"code": "import time\ntime.sleep(3.0)\n1"})])
                               for e in episodes))
        elapsed = time.monotonic() - start
    finally:
        tools.close()
    assert [content(r) for r in replies] == ["1\n"] * 4
    assert elapsed < 8.0, f"{elapsed:.2f} s for 4 calls of 3 s: they ran one by one"


def _carries_on(tools, episode, reply, needle):
    assert reply.tool_errors == 1, reply
    assert content(reply).startswith("error:"), content(reply)
    assert needle in content(reply), content(reply)
    after, = tools.turn((episode, [("add", {"a": 1, "b": 2})]))
    assert content(after) == "3" and after.tool_errors == 0


@pytest.mark.parametrize("call, needle", [
    (("boom", {"message": "no luck"}), "ValueError: no luck (line 21)"),
    (("python", {"code": "import time\nwhile True:\n    time.sleep(0.01)"}), "over 1 s"),
    (("python", {"code": "while True:\n    pass"}), "over 1 s"),
    (("python", {"code": "print('x' * (10 * 1024 * 1024))"}), "output limit exceeded"),
    (("python", {"code": "import os\nwhile True:\n    os.fork()"}),
     "PermissionError: [Errno 1] Operation not permitted"),
    (("python", {"code": "import subprocess\nsubprocess.run(['id'])"}), "PermissionError"),
    (("python", {"code": "import os\nos._exit(3)"}), "exited with status 3"),
    (("python", {"code": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)"}),
     "PermissionError"),
    pytest.param(("python", {"code": "import signal\nsignal.setitimer(signal.ITIMER_REAL, 0)\n"
                                     "while True:\n    try:\n        pass\n"
                                     "    except BaseException:\n        pass"}), "killed",
                 marks=pytest.mark.slow),  # killed by the server's deadline: 5 s
    (("python", {"code": "class Slow:\n    def __repr__(self):\n        while True: pass\n"
                         "Slow()"}), "over 1 s"),
])
def test_a_failing_call_answers_with_an_error(tools, call, needle):
    episode = tools.episode()
    reply, = tools.turn((episode, [call]))
    _carries_on(tools, episode, reply, needle)


@pytest.mark.parametrize("call, needle", [
    (("spin", {"n": 0}), "over 1 s"),
    (("chatter", {"megabytes": 8}), "output limit exceeded"),
    (("spawn", {"seconds": 600}), "PermissionError: [Errno 1] Operation not permitted"),
])
def test_a_hostile_tenant_tool_answers_with_an_error_in_time(tools, call, needle):
    """The tenant's own tool functions (not only the interpreter tool) hang, print megabytes,
    leave a child behind: the model gets an error within the tool timeout (1 s here; the
    server's hard deadline, 5 s, is not what ends it), counted, the episode carries on, and
    close() leaves no process (the fixture checks)."""
    episode = tools.episode()
    start = time.monotonic()
    reply, = tools.turn((episode, [call]))
    assert time.monotonic() - start < 4.0, "the call was not ended by the tool timeout"
    _carries_on(tools, episode, reply, needle)


@pytest.mark.slow  # killed by the server's deadline: 5 s
def test_a_hang_that_ignores_signals_is_killed(tools):
    episode = tools.episode()
    reply, = tools.turn((episode, [("python", {"code": "sum(range(10**12))"})]))
    _carries_on(tools, episode, reply, "killed")


def test_a_huge_answer_is_cut(tools):
    episode = tools.episode()
    reply, = tools.turn((episode, [("python", {"code": "v = 'y' * 10**6\nv"})]))
    assert reply.tool_errors == 0
    assert len(content(reply)) < MAX_CONTENT_CHARS + 100 and "more characters cut" in content(reply)


def test_reading_another_tenants_folder_fails(tools, tmp_path):
    other = tmp_path / "other-tenant"
    other.mkdir()
    (other / "data.jsonl").write_text(SECRET)
    episode = tools.episode()
    reply, = tools.turn((episode, [("read", {"path": str(other / "data.jsonl")})]))
    assert SECRET not in content(reply)
    _carries_on(tools, episode, reply, "Error: [Errno")


@pytest.fixture
def listening_port():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    yield server.getsockname()[1]
    server.close()


def test_opening_a_socket_fails(tools, listening_port):
    episode = tools.episode()
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {listening_port}), timeout=1)"
    reply, = tools.turn((episode, [("python", {"code": code})]))
    _carries_on(tools, episode, reply, "Error")


def test_close_while_a_call_runs_leaves_nothing_running():
    env = Env(tool_timeout_s=30.0)
    episode = env.episode()
    replies = []
    worker = threading.Thread(target=lambda: replies.extend(env.turn(
        (episode, [("python", {"code": "import time\ntime.sleep(25)"})]))))
    worker.start()
    deadline = time.monotonic() + 20
    while not processes_with(env.tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    assert processes_with(env.tag), "the call never started"
    env.close()  # asserts that no process of the environment is left
    worker.join(30)
    assert not worker.is_alive()
    assert content(replies[0]).startswith("error: the tool's sandbox failed")


def test_a_stop_ends_a_batch_of_calls_within_a_second():
    class Stopped(Exception):
        pass

    env = Env(tool_timeout_s=30.0)
    started = time.monotonic()

    def stop_check():
        if time.monotonic() - started > 1.0:
            raise Stopped

    env.env.stop_check = stop_check
    try:
        with pytest.raises(Stopped):
            env.turn(*((env.episode(n), [("python", {"code": "import time\ntime.sleep(25)"})])
                       for n in range(3)))
        assert time.monotonic() - started < 4.0
        assert processes_with(env.tag) == [], "the stopped batch's sandboxes still run"
        env.env.stop_check = None
        after, = env.turn((env.episode(), [("add", {"a": 1, "b": 2})]))
        assert content(after) == "3"  # the environment still serves
    finally:
        env.close()


def test_env_reward_judges_the_state_the_tools_left():
    env = Env(reward="env")
    try:
        episode = env.episode()
        env.turn((episode, [("note", {"text": "x"}), ("note", {"text": "y"})]))
        # The model's code looks for the tools' globals through the garbage collector (to
        # write its own reward): they are not in its process.
        hack = ("import gc\nfound = 0\nfor o in gc.get_objects():\n"
                "    if isinstance(o, list) and o[:2] == ['x', 'y']:\n"
                "        o.extend(['z'] * 10)\n        found += 1\nprint(found)")
        hacked, = env.turn((episode, [("python", {"code": hack})]))
        assert content(hacked) == "0\n"
        seen, = env.turn((episode, [("note", {"text": "w"})]))
        assert content(seen) == "x, y, w"
        assert asyncio.run(episode.finish([{"role": "assistant", "content": "done"}])) == 3.0
    finally:
        env.close()


def test_a_broken_env_reward_raises_from_finish():
    env = Env(reward="env", tools=TOOLS.replace("return float(len(NOTES))", "return 'many'"))
    try:
        with pytest.raises(RuntimeError, match="not a finite number"):
            asyncio.run(env.episode().finish([]))
    finally:
        env.close()


def test_the_operator_sets_how_many_sandboxes_a_job_gets():
    """BRORL_TOOL_SANDBOXES (trainer settings) sizes the tools environment's pool; empty is the
    default, a bad value is an error naming the variable."""
    from trainer.settings import trainer_settings

    assert trainer_settings({"BRORL_TOOL_SANDBOXES": ""}).tool_sandboxes is None
    with pytest.raises(ValueError, match="BRORL_TOOL_SANDBOXES"):
        trainer_settings({"BRORL_TOOL_SANDBOXES": "0"})
    env = build({"tools": TOOLS, "reward": "grader"},
                settings=trainer_settings({"BRORL_TOOL_SANDBOXES": "3"}), tag="brorl-tools-test-size")
    try:
        assert env.pool.size == 3
    finally:
        env.close()

