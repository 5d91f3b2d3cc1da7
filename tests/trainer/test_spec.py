"""The job spec: defaults as docs/jobspec.md lists them, bounds refused with the field named."""
import json

import pytest
from pydantic import ValidationError

from trainer.spec import JobSpec, json_schema, load_spec, spec_errors

RG = {"reasoning_gym": {"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 3, "max_digits": 2}}}


def make(**over):
    return JobSpec.model_validate({"name": "t", "task": RG, **over})


def field_of(data) -> list[str]:
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(data)
    return [e["field"] for e in spec_errors(exc.value)]


def test_defaults_match_jobspec():
    s = make()
    assert s.spec_version == 1 and s.model.path == "builtin:tiny" and s.model.dtype == "auto"
    # The engine default depends on the device: auto picks vllm on CUDA and hf on a CPU
    # (trainer/engines/__init__.py: default_engine).
    assert s.rollout.engine == "auto"
    assert [(x.n, x.prompts_per_step, x.steps) for x in s.rollout.schedule] == [(16, 64, 200), (512, 16, 100)]
    assert (s.optim.lr, s.optim.lr_scaling, s.optim.betas) == (1e-6, "sqrt", (0.9, 0.999))
    a = s.algo
    assert (a.advantage, a.clip_low, a.clip_high, a.kl_coef, a.kl_estimator) == ("reinforce_pp_baseline", 0.2, 0.27, 1e-4, "k2")
    assert (a.ref_reset_every, a.max_refill_rounds, a.is_truncation, a.mini_batches) == (300, 3, (0.5, 5.0), 4)
    assert (s.eval.every, s.eval.samples_per_prompt, s.eval.k, s.eval.temperature, s.eval.top_p) == (50, 16, [1, 4, 16], 0.6, 0.95)
    assert (s.checkpoint.every, s.checkpoint.keep_last, s.limits.max_attempts) == (50, 3, 3)
    assert s.total_steps == 300


def test_frozen_and_roundtrip():
    s = make()
    with pytest.raises(ValidationError):
        s.name = "x"
    assert JobSpec.model_validate_json(s.model_dump_json()) == s


@pytest.mark.parametrize("over, field", [
    ({"bogus": 1}, "bogus"),
    ({"rollout": {"schedule": [{"n": 1, "prompts_per_step": 4, "steps": 1}]}}, "rollout.schedule.0.n"),
    ({"rollout": {"schedule": [{"n": 4096, "prompts_per_step": 257, "steps": 1}]}}, "rollout.schedule.0"),
    ({"optim": {"lr": -1}}, "optim.lr"),
    ({"seed": "abc"}, "seed"),
    ({"algo": {"clip_high": 0.1}}, "algo.clip_high"),
    ({"algo": {"is_truncation": [2, 5]}}, "algo.is_truncation"),
    ({"algo": {"mini_batches": 10**6}}, "algo.mini_batches"),
    ({"eval": {"k": [1, 32]}}, "eval.k"),
    ({"rollout": {"temperature": 0}}, "rollout.temperature"),
    ({"rollout": {"schedule": []}}, "rollout.schedule"),
    ({"name": ""}, "name"),
])
def test_bounds_name_the_field(over, field):
    assert field in field_of({"name": "t", "task": RG, **over})


def test_task_rules():
    assert field_of({"name": "t", "task": {}}) == ["task"]
    both = {"reasoning_gym": RG["reasoning_gym"], "dataset": {"id": "ds_1"}}
    assert field_of({"name": "t", "task": both}) == ["task"]
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate({"name": "t", "task": {"reasoning_gym": {"name": "chain_summ"}}})
    err = spec_errors(exc.value)[0]
    assert err["field"] == "task.reasoning_gym.name" and "chain_sum" in err["message"]
    bad_cfg = {"reasoning_gym": {"name": "chain_sum", "config": {"nope": 1}}}
    assert field_of({"name": "t", "task": bad_cfg}) == ["task.reasoning_gym.config"]
    assert field_of({"name": "t", "task": {**RG, "prompt_template": "no placeholder"}}) == ["task.prompt_template"]


def test_spec_is_torch_free_and_schema(tmp_path):
    import subprocess
    import sys

    code = "import sys, trainer.spec, trainer.algo.schedule; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
    schema = json_schema()
    assert schema["additionalProperties"] is False and "rollout" in schema["properties"]
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"name": "t", "task": RG}))
    assert load_spec(p).name == "t"


def test_committed_json_schema_is_current():
    from pathlib import Path

    committed = json.loads((Path(__file__).parents[2] / "docs" / "jobspec.schema.json").read_text())
    assert committed == json_schema(), "regenerate with: make docs (or brorl schema -o docs/jobspec.schema.json)"


def test_resources_defaults_bounds_and_one_node():
    s = make()
    assert (s.resources.gpus_per_node, s.resources.nodes) == (1, 1)
    assert make(resources={"gpus_per_node": 4}).resources.gpus_per_node == 4
    assert field_of({"name": "t", "task": RG, "resources": {"gpus_per_node": 0}}) == ["resources.gpus_per_node"]
    assert field_of({"name": "t", "task": RG, "resources": {"gpus_per_node": 65}}) == ["resources.gpus_per_node"]
    # Many nodes validate here; whether a deployment serves them is the API's check (check_nodes).
    two = make(resources={"nodes": 2, "gpus_per_node": 4})
    assert (two.resources.nodes, two.resources.world_size) == (2, 8)
    assert field_of({"name": "t", "task": RG, "resources": {"nodes": 0}}) == ["resources.nodes"]
    # min_nodes: a job that may shrink to fewer nodes, never to more than it asks for.
    assert make(resources={"nodes": 4, "min_nodes": 2}).resources.min_nodes == 2
    assert make().resources.min_nodes is None
    assert field_of({"name": "t", "task": RG, "resources": {"nodes": 2, "min_nodes": 3}}) == ["resources.min_nodes"]
    assert field_of({"name": "t", "task": RG, "resources": {"nodes": 2, "min_nodes": 0}}) == ["resources.min_nodes"]
    # 2 nodes x 1 GPU are many ranks: FSDP2 shards, so only fp32 AdamW state.
    assert field_of({"name": "t", "task": RG, "resources": {"nodes": 2},
                     "optim": {"optimizer_state": "bf16"}}) == ["optim.optimizer_state"]


def test_lora_runs_on_many_ranks_and_keeps_its_true_refusals():
    s = make(model={"lora": {"rank": 8}}, resources={"gpus_per_node": 2})
    assert s.model.lora.rank == 8 and s.resources.gpus_per_node == 2
    # An adapter's AdamW state is float32 on any rank count (the LoRA rule says so, not FSDP2's).
    for gpus in (1, 2):
        with pytest.raises(ValidationError) as exc:
            make(model={"lora": {}}, optim={"optimizer_state": "8bit"}, resources={"gpus_per_node": gpus})
        [err] = spec_errors(exc.value)
        assert err["field"] == "model.lora" and "use fp32" in err["message"] and "FSDP2" not in err["message"]
    assert field_of({"name": "t", "task": RG, "optim": {"optimizer_state": "8bit"},
                     "resources": {"gpus_per_node": 2}}) == ["optim.optimizer_state"]
    assert field_of({"name": "t", "task": RG, "model": {"lora": {"rank": 1024}}, "rollout": {"engine": "vllm"},
                     "resources": {"gpus_per_node": 2}}) == ["model.lora.rank"]
