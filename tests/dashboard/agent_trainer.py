"""A trainer double for the agent page test (`AGENT_ENTRYPOINT`, set as BRORL_TRAINER_ENTRYPOINT):
it reports through the sink exactly what the real trainer reports for a multi-turn job, per
step: the episode metrics (`env/...`, `time/env_s`) and two samples as `trainer.samples`
writes them, one a tool-using episode (with a failed tool call and hostile text in a tool's
output), one single-turn; then a checkpoint, like `tests.support.fake_trainer`.

The real multi-turn trainer is tested in tests/trainer; what this page test checks is the way
from the sink to the page (worker sink, store, API, browser), which is the real one.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from tests.support.fake_trainer import FakeResult, write_checkpoint

AGENT_ENTRYPOINT = "tests.dashboard.agent_trainer:train"
STEPS = 3
HOSTILE = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'


def transcript(step: int) -> list[dict]:
    return [
        {"role": "system", "content": "You can call add(a, b)."},
        {"role": "user", "content": f"What is 123456 + {step}?"},
        {"role": "assistant", "content": "Let me add.",
         "tool_calls": [{"id": "call_0", "type": "function",
                         "function": {"name": "add", "arguments": {"a": 123456, "b": step}}}]},
        {"role": "tool", "tool_call_id": "call_0", "name": "add", "content": str(123456 + step)},
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "shell", "arguments": {"cmd": "rm -rf /"}}}]},
        # as the built-in tools answer a failed call (no `error` flag: the text says it)
        {"role": "tool", "tool_call_id": "call_1", "name": "shell",
         "content": f"error: unknown tool 'shell' {HOSTILE}"},
        {"role": "assistant", "content": f"<answer>{123456 + step}</answer>"},
    ]


def rows(step: int) -> list[dict]:
    multi = {"prompt": f"What is 123456 + {step}?", "completion": f"<answer>{123456 + step}</answer>",
             "reward": 1.0, "correct": True, "truncated": False, "advantage": 0.5, "sub_rewards": {},
             "messages": transcript(step), "turns": 3, "tool_calls": 2, "tool_errors": 1}
    single = {"prompt": "What is 2 + 2?", "completion": "5", "reward": 0.0, "correct": False,
              "truncated": False, "advantage": -0.5, "sub_rewards": {}}
    broken = {"prompt": "What is 1 + 1?", "completion": "", "reward": 0.0, "correct": False,
              "truncated": False, "advantage": -0.5, "sub_rewards": {},
              "messages": transcript(step)[:3], "turns": 1, "tool_calls": 1, "tool_errors": 0,
              "env_error": f"ConnectionError: the server went away {HOSTILE}"}
    return [multi, single, broken]


def train(spec, sink, should_stop: Callable[[], bool], resume: Path | None = None, *,
          out_dir: Path, dataset_path: Path | None = None, start_from=None) -> FakeResult:
    sink.event("stage_started", {"stage": 0, "n": spec.rollout.schedule[0].n})
    for step in range(1, STEPS + 1):
        if should_stop():
            return FakeResult(step - 1, True, None)
        sink.metrics(step, {"reward_mean": 0.2 * step, "loss": 1.0 / step, "stage": 0, "n": 4,
                            "gen_s": 1.5, "env/turns_mean": 2.0 + 0.25 * step,
                            "env/tool_calls_mean": 1.5 + 0.25 * step, "env/tool_errors_mean": 0.5 / step,
                            "env/budget_truncated_frac": 0.25, "env/errors": 0, "time/env_s": 0.3})
        sink.samples(step, rows(step))
    checkpoint, nbytes, sha = write_checkpoint(Path(out_dir), STEPS)
    sink.checkpoint(STEPS, checkpoint, nbytes, sha)
    return FakeResult(STEPS, False, checkpoint)
