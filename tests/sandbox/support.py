"""What the sandbox attack tests share: the limits they run under, and `attack`, which grades
[right, wrong, ATTACK, right] with a python grader that attacks only on the ATTACK sample."""
from __future__ import annotations

import os
import textwrap
import uuid

from trainer.graders import GraderRuntime
from trainer.graders.sandbox.layer import Limits
from trainer.graders.sandbox.process import processes_with as _tagged_processes

LIMITS = Limits(memory_bytes=1024**3, tmp_bytes=32 * 1024**2, file_bytes=8 * 1024**2,
                timeout_s=2.0)
SECRET = "brorl-test-secret-" + uuid.uuid4().hex


def attack(body: str, mode: str = "python") -> tuple[list, str]:
    """Grade [right, wrong, ATTACK, right] with a grader whose attack is `body`."""
    source = "import os, sys, socket, time, signal\n" \
             "def attack(item):\n" + textwrap.indent(textwrap.dedent(body), "    ") + \
             "\ndef grade(sample, item):\n" \
             "    if sample['output_text'] == 'ATTACK':\n" \
             "        attack(item)\n" \
             "        return 1.0\n" \
             "    return 1.0 if sample['output_text'] == item['answer'] else 0.0\n"
    grader = {"type": "python", "name": "attack", "source": source}
    texts = ["right", "wrong", "ATTACK", "right"]
    items = [{"answer": "right", "secret_path": os.environ.get("BRORL_TEST_PATH", "")}] * 4
    tag = "brorl-attack-" + uuid.uuid4().hex
    with GraderRuntime(pool_size=2, limits=LIMITS, tag=tag) as runtime:
        results = runtime.grade(grader, texts, items)
    assert _tagged_processes(tag) == [], "a sandbox process outlived the runtime"
    return results, tag


def check(results, flag: str = "python_grader_runtime_error", contains: str = "") -> None:
    right, wrong, bad, right2 = results
    assert (right.reward, wrong.reward, right2.reward) == (1.0, 0.0, 1.0)
    assert not right.failed and not wrong.failed and not right2.failed
    assert bad.reward == 0.0 and bad.errors[flag], (bad.errors, bad.details)
    assert contains in bad.details, bad.details
