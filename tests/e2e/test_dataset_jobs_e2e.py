"""Uploaded datasets and every example spec, end to end through `brorl up`.

The real API stores each spec with its defaults written out and the real worker re-validates
it: a dataset + grader job was accepted and then failed at step 0 that way, and no test ran
one. Here one stack runs, side by side:
- a `{prompt, answer}` dataset rewarded by a python grader, and an OpenAI RFT dataset
  (`{"messages": [...], "reference_answer": ...}`, content given as input_text parts) whose
  multi grader's python part reads `item["reference_answer"]`, each to `succeeded` with its
  grader's rewards in the metrics and the stored samples;
- every example spec under examples/ (each submitted as written, with the placeholder dataset
  id replaced by an upload of the data file it names), shortened to one step per stage; the
  agent examples against the environments they name, listed as an operator lists them
  (BRORL_ENVIRONMENTS with the package importable, BRORL_OPENENV_SERVERS with a server this
  test starts).

The model is the suite's shared warm-started builtin:tiny (tests/support/tinyprebuild.py),
passed as a folder under BRORL_MODEL_ROOTS: a dataset job on builtin:tiny would warm-start a
model of its own (the cache key holds the dataset id), minutes each. The datasets hold the
shared task's own questions, rendered as the warm start saw them, so the model answers some.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from cli.client import BrorlAPIError, BrorlClient
from trainer.spec import ReasoningGymTask
from trainer.tasks import reasoning_gym_task
from trainer.tasks.prompts import PLAIN_INSTRUCTION
from tests.support.openenv_server import guess_server
from tests.support.tinyprebuild import SHARED_SEED, shared_model_dir, shared_task
from tests.support.upstack import Stack, running_stack
from tests.support.services import grader_sandbox_missing, needs_service

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(900),
              needs_service("a grader sandbox", grader_sandbox_missing())]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PLACEHOLDER = "ds_REPLACE_WITH_UPLOADED_ID"
# The data file each example with a placeholder dataset id names in its comment.
EXAMPLE_DATA = {"graders/code_spec.yaml": "data/code_problems.jsonl",
                "rft_messages.yaml": "data/rft_sums.jsonl"}
# The agent examples name environments the operator lists; this stack lists them as an
# operator would. verifiers.yaml's `vf-calc` is the package in tests/support/vf_envs (the
# example's own comment says so), importable through PYTHONPATH. openenv.yaml's `wordle` is the
# operator's name for a server: here the test's OpenEnv server (tests/support/openenv_server,
# openenv-core's own classes) stands behind that name, as TextArena's Wordle server would.
VF_ENVS = Path(__file__).resolve().parents[2] / "tests" / "support" / "vf_envs"
OPENENV_NAME = "wordle"
# Examples that cannot run here, with the reason (each other one runs with the hf engine).
CPU_SKIPS: dict[str, str] = {}

RIGHT_PY = """
import re

def grade(sample, item):
    m = re.search(r"<answer>(.*?)</answer>", sample["output_text"])
    return float(m is not None and m.group(1).strip() == str(item["%s"]))
"""
PYTHON = {"type": "python", "name": "right answer", "source": RIGHT_PY % "answer"}
MULTI = {"type": "multi", "name": "reference and format",
         "calculate_output": "0.75 * right + 0.25 * tagged",
         "graders": {"right": {"type": "python", "name": "right", "source": RIGHT_PY % "reference_answer"},
                     "tagged": {"type": "string_check", "name": "tagged",
                                "input": "{{ sample.output_text }}", "reference": "</answer>",
                                "operation": "like"}}}


def _short(spec: dict, model_dir: Path) -> dict:
    """`spec` shortened to seconds on a CPU: one step per stage, a few samples, the shared
    model; the rest (task, reward, grader, algorithm) as written."""
    spec = copy.deepcopy(spec)
    # The shared model stands in for builtin:tiny and for a Hub model alike (openenv.yaml's
    # Qwen2.5-0.5B): the suite downloads no weights, and a CPU trains no 0.5B model in minutes.
    spec.setdefault("model", {})["path"] = str(model_dir)
    rollout = spec.setdefault("rollout", {})
    stages = rollout.get("schedule") or [{}]
    rollout["schedule"] = [{"n": 4, "prompts_per_step": 2, "steps": 1} for _ in stages]
    # The hf engine: vLLM's own tests cover it (tests/trainer/engines/test_train_vllm.py); its start
    # alone would be most of this test's time on a CPU.
    rollout["engine"] = "hf"
    rollout["max_new_tokens"] = min(rollout.get("max_new_tokens", 256), 32)
    spec["eval"] = {"every": 0, "samples_per_prompt": 2, "k": [1]}
    spec["checkpoint"] = {"every": 0, "keep_last": 1}
    spec["samples"] = {"per_step": 4}
    spec.setdefault("algo", {})["mini_batches"] = 1
    spec["algo"]["max_refill_rounds"] = 0
    rg = spec["task"].get("reasoning_gym")
    if rg is not None:
        rg["train_size"] = min(rg.get("train_size", 10_000), 200)
        rg["eval_size"] = min(rg.get("eval_size", 200), 4)
    return spec


def _dataset_spec(name: str, dataset_id: str, grader: dict, model_dir: Path) -> dict:
    return _short({"spec_version": 1, "name": name, "seed": SHARED_SEED,
                   "task": {"dataset": {"id": dataset_id, "eval_fraction": 0.1},
                            "grader": grader, "reward": "score"},
                   "rollout": {"max_new_tokens": 24, "schedule": [{}, {}]},
                   "optim": {"lr": 1e-4}}, model_dir)


def _example_specs() -> list[str]:
    """Every job spec under examples/ (a YAML with a `task`: the one required section)."""
    return sorted(str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*.y*ml")
                  if "task" in (yaml.safe_load(p.read_text()) or {}))


@functools.lru_cache(maxsize=1)
def _shared_examples() -> list:
    rg = ReasoningGymTask(**shared_task()["reasoning_gym"])
    return reasoning_gym_task.build(rg, seed=SHARED_SEED).train[:40]


def _write_datasets(folder: Path) -> tuple[Path, Path]:
    """The shared task's training questions as {prompt, answer} rows and as RFT rows."""
    examples = _shared_examples()
    plain, rft = folder / "plain.jsonl", folder / "rft.jsonl"
    plain.write_text("".join(json.dumps({"prompt": ex.question, "answer": ex.answer}) + "\n"
                             for ex in examples))
    # The messages render as their text and a newline: the prompt the warm start trained on.
    rft.write_text("".join(json.dumps({
        "messages": [{"role": "user", "content": [
            {"type": "input_text", "text": ex.question}, {"type": "input_text", "text": f"\n{PLAIN_INSTRUCTION}"}]}],
        "reference_answer": ex.answer, "source": "chain_sum"}) + "\n" for ex in examples))
    return plain, rft


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[tuple[Stack, Path]]:
    model_dir = shared_model_dir()
    assert (model_dir / "config.json").exists()
    with contextlib.ExitStack() as servers:
        try:
            server_url = servers.enter_context(guess_server(max_sessions=16))
        except pytest.skip.Exception as exc:   # no openenv-core here (CI fails instead)
            CPU_SKIPS["agents/openenv.yaml"] = f"no OpenEnv server: {exc}"
            server_url = None
        path = os.pathsep.join(p for p in (str(VF_ENVS), os.environ.get("PYTHONPATH", "")) if p)
        with running_stack(tmp_path_factory.mktemp("datasets"), {
                "BRORL_TRAINER_ENTRYPOINT": None, "OMP_NUM_THREADS": "1",
                "BRORL_MODEL_ROOTS": str(model_dir.parent),
                "PYTHONPATH": path, "BRORL_ENVIRONMENTS": "vf-calc",
                "BRORL_OPENENV_SERVERS": json.dumps({OPENENV_NAME: server_url}) if server_url else None}) as stack:
            yield stack, model_dir


@pytest.fixture(scope="module")
def finished(stack, tmp_path_factory) -> dict[str, dict]:
    """Every job of this module, submitted at once and run to the end."""
    stack, model_dir = stack
    plain, rft = _write_datasets(tmp_path_factory.mktemp("rows"))
    with BrorlClient(stack.url, stack.key, timeout=30) as client:
        specs = {"python": _dataset_spec("python", client.upload_dataset(plain)["id"], PYTHON, model_dir),
                 "multi": _dataset_spec("multi", client.upload_dataset(rft)["id"], MULTI, model_dir)}
        for rel in _example_specs():
            if rel in CPU_SKIPS:
                continue
            spec = yaml.safe_load((EXAMPLES / rel).read_text())
            dataset = spec["task"].get("dataset")
            if dataset is not None and dataset["id"] == PLACEHOLDER:
                dataset["id"] = client.upload_dataset(EXAMPLES / EXAMPLE_DATA[rel])["id"]
            specs[rel] = _short(spec, model_dir)
        ids = {name: client.submit(spec)["id"] for name, spec in specs.items()}
        jobs = {}
        for name, job_id in ids.items():
            job = client.wait(job_id, poll=1, timeout=600)
            job["metric_rows"] = client.metrics(job_id)["data"]
            job["sample_rows"] = client._json("GET", f"/v1/jobs/{job_id}/samples",
                                              params={"step": 1})["data"]
            job["event_rows"] = client.events(job_id)["data"]
            jobs[name] = job
        return jobs


def _check_succeeded(job: dict, stack) -> None:
    assert job["status"] == "succeeded", (job.get("error"), job["event_rows"][-5:],
                                          stack[0].output()[-3000:])


def _right(sample: dict) -> float:
    """What the grader's "right" part must have given `sample`: the row is found by its prompt
    (the question, rendered as the warm start saw it), its answer compared by hand."""
    answers = {ex.question: ex.answer for ex in _shared_examples()}
    question = sample["prompt"].removesuffix(f"\n{PLAIN_INSTRUCTION}\n")
    m = re.search(r"<answer>(.*?)</answer>", sample["completion"])
    return float(m is not None and m.group(1).strip() == answers[question])


def _trained(job: dict) -> list[dict]:
    return [row["values"] for row in job["metric_rows"] if row["step"] > 0]


def test_a_prompt_dataset_with_a_python_grader_succeeds(finished, stack):
    job = finished["python"]
    _check_succeeded(job, stack)
    assert job["spec"]["task"]["dataset"]["verifier"] is None  # stored as it re-validates
    rows = _trained(job)
    assert len(rows) == 2
    for values in rows:
        assert values["grader/errors"] == 0 and values["grader/seconds"] > 0
    samples = job["sample_rows"]
    assert samples and all(s["sub_rewards"] == {} for s in samples)
    # The grader's reward is the one trained on: 1 exactly where the answer is the row's.
    for s in samples:
        assert s["reward"] == (0.0 if s["truncated"] else _right(s))


def test_an_rft_messages_dataset_with_a_multi_grader_reads_reference_answer(finished, stack):
    job = finished["multi"]
    _check_succeeded(job, stack)
    rows = _trained(job)
    assert len(rows) == 2
    for values in rows:
        assert values["grader/errors"] == 0
        assert {"reward/right", "reward/tagged"} <= set(values)
    assert sum(v["reward/tagged"] for v in rows) > 0  # the warm-started model closes its tag
    # item["reference_answer"] reached the grader: some answers are right (pass@1 ~0.3 on 16).
    assert sum(v["reward/right"] for v in rows) > 0
    samples = job["sample_rows"]
    for s in samples:
        assert set(s["sub_rewards"]) == {"right", "tagged"}
        if not s["truncated"]:
            want = 0.75 * s["sub_rewards"]["right"] + 0.25 * s["sub_rewards"]["tagged"]
            assert s["reward"] == pytest.approx(want, abs=1e-6)
            assert s["sub_rewards"]["right"] == _right(s)  # item["reference_answer"], the row's
    # The prompt is the messages' plain text (builtin:tiny has no chat template).
    assert all(s["prompt"].endswith(f"\n{PLAIN_INSTRUCTION}\n") for s in samples)


@pytest.mark.parametrize("example", _example_specs())
def test_every_example_spec_runs(example, finished, stack):
    if example in CPU_SKIPS:
        pytest.skip(CPU_SKIPS[example])
    job = finished[example]
    _check_succeeded(job, stack)
    stages = len(yaml.safe_load((EXAMPLES / example).read_text())["rollout"]["schedule"])
    assert len(_trained(job)) == stages


def test_every_placeholder_dataset_names_its_data():
    for rel in _example_specs():
        dataset = yaml.safe_load((EXAMPLES / rel).read_text())["task"].get("dataset")
        if dataset is not None and dataset["id"] == PLACEHOLDER:
            assert rel in EXAMPLE_DATA, f"{rel}: add the data file it trains on to EXAMPLE_DATA"
            assert (EXAMPLES / EXAMPLE_DATA[rel]).exists(), rel


def test_a_bad_rft_line_is_refused_at_upload_naming_line_and_field(stack, tmp_path):
    bad = tmp_path / "bad.jsonl"
    good = {"messages": [{"role": "user", "content": "2 + 2?"}], "reference_answer": "4"}
    bad.write_text("\n".join(json.dumps(r) for r in [
        good, good, {"messages": [good["messages"][0], {"role": "user", "content": {"text": "x"}}]}]))
    with BrorlClient(stack[0].url, stack[0].key, timeout=30) as client:
        with pytest.raises(BrorlAPIError) as exc:
            client.upload_dataset(bad)
    assert exc.value.status == 422
    assert "line 3: messages[1].content: must be a string or a list of text parts" in str(exc.value)
