"""A pass@k probe of a job with a multi-turn `task.env` samples episodes, never single
completions: the real probe (`trainer.probe.probe`, what `worker.probe_job` runs) on the
suite's shared warm-started builtin:tiny with a built-in tools environment in the real
sandbox, whose `_reward` (reward: env) scores every episode, then nothing of the
environment is left running."""
import pytest

from tests.support.services import require_service
from tests.support.tinyprebuild import shared_model_dir, shared_task

# reward: env scores each episode with the tools' own _reward, run in the sandbox after the
# episode: a value no single-turn grading (0 or 1) gives, so the probe's rewards prove episodes.
TOOLS = '''
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


def _reward(messages: list) -> float:
    return 0.375
'''
ENV = {"type": "tools", "tools": TOOLS, "tool_timeout_s": 5, "max_turns": 2, "max_total_tokens": 48,
       "reward": "env"}
N, PROMPTS = 4, 2


def env_task() -> dict:
    return shared_task(env=ENV)


def tools_tag(spec) -> str:
    """The sandbox tag `trainer.run.job_environment` gives a spec opened outside a job folder."""
    from trainer.run import spec_sha256

    return "brorl-" + spec_sha256(spec)[:12]


def _sandbox_or_skip():
    """Skips where no tool sandbox runs (fails in CI, which must provide one)."""
    from trainer.graders.sandbox.layer import SandboxUnavailable
    from trainer.rollouts.environments.tools_env import build

    try:
        build({"tools": "def f(x: int) -> int:\n    return x\n"}, tag="brorl-probe-env-check").close()
    except SandboxUnavailable as exc:
        require_service("a tool sandbox", str(exc))  # skipped here, failed in CI


def test_a_probe_of_a_tools_env_job_runs_episodes_and_leaves_nothing_running():
    from trainer.graders.sandbox.process import processes_with
    from trainer.probe import probe
    from trainer.probe_spec import ProbeSpec, base_job_spec

    _sandbox_or_skip()
    spec = ProbeSpec(task=env_task(), n=N, prompts=PROMPTS, max_new_tokens=24, engine="hf", chunk_samples=16)
    base = base_job_spec(spec)
    tag = "brorl-prb_envtest-attempt-1"  # the worker names it by the probe's id and attempt
    seen: list[str] = []

    def progress(p):
        seen.extend(processes_with(tag))  # the environment is open: its sandboxes run

    result = probe(spec, base, lambda: False, model_dir=shared_model_dir(), on_progress=progress,
                   name="prb_envtest-attempt-1")

    assert seen, "no sandbox process of the probe's environment was ever seen"
    assert processes_with(tag) == []
    assert result["samples"] == N * PROMPTS and result["prompts"] == PROMPTS
    env = result["env"]
    assert 1 <= env["turns_mean"] <= ENV["max_turns"] and env["errors"] == 0, env
    assert env["tool_errors_mean"] <= env["tool_calls_mean"] and env["seconds"] > 0
    # Every sample's reward is the environment's (_reward's 0.375), none the verifier's 0 or 1.
    assert [r["mean_reward"] for r in result["per_prompt"]] == pytest.approx([0.375] * PROMPTS), result
    assert [r["correct"] for r in result["per_prompt"]] == [0] * PROMPTS  # correct: a reward >= 1


def test_an_env_task_without_an_environment_is_never_sampled_single_turn():
    from trainer.evaluate import EvalContext
    from trainer.probe import rollout_chunk
    from trainer.rollouts import SamplingConfig
    from trainer.spec import JobSpec

    job = JobSpec.model_validate({"name": "t", "task": env_task(), "rollout": {"max_new_tokens": 24}})
    calls = []

    class Engine:
        def generate(self, *a, **k):
            calls.append(a)
            raise AssertionError("sampled single-turn")

    ctx = EvalContext(Engine(), None, None, [object()], [[1, 2]], env=None)
    with pytest.raises(RuntimeError, match="task.env"):
        rollout_chunk(ctx, job, [0], SamplingConfig(n=2, max_new_tokens=24), lambda: None)
    assert calls == []
