"""A run resumed under a spec other than its checkpoint's continues with the new values and
says which fields changed in a `warning` event; the same spec resumes silently; the
checkpoint keeps the spec it was trained under, and the next one records the new spec."""
import torch

from tests.trainer.checkpoints.test_checkpoint import small_model
from trainer.checkpoints import io as checkpoint
from trainer.loop import _check_resumed_spec
from trainer.run import spec_sha256
from trainer.sink import ListSink
from trainer.spec import JobSpec, changed_fields
from trainer.models.tiny import build_tokenizer


def _spec(**over) -> JobSpec:
    return JobSpec.model_validate({"name": "t", "task": {"reasoning_gym": {"name": "chain_sum"}}, **over})


def _saved_state(tmp_path, spec: JobSpec) -> checkpoint.TrainerState:
    """The trainer state as a resume reads it back from a checkpoint saved under `spec`."""
    model, tok = small_model(), build_tokenizer()
    opt = torch.optim.AdamW(model.parameters())
    state = checkpoint.TrainerState(step=3, stage=0, data_cursor=12, ref_step=3,
                                    spec_sha256=spec_sha256(spec), spec=spec.model_dump(mode="json"))
    saved = checkpoint.save(tmp_path, state, model, tok, opt, None)
    return checkpoint.load_state(saved.path, torch.optim.AdamW(small_model().parameters()), None)


def _resume(spec, state):
    run, sink = type("Run", (), {"spec": spec, "state": state})(), ListSink()
    _check_resumed_spec(run, sink)
    return sink.events


def test_changed_fields_are_dotted_paths():
    a = _spec().model_dump(mode="json")
    b = _spec(optim={"lr": 2e-6}, seed=4).model_dump(mode="json")
    assert changed_fields(a, b) == ["optim.lr", "seed"]
    assert changed_fields(a, a) == []


def test_same_spec_resumes_silently(tmp_path):
    spec = _spec()
    state = _saved_state(tmp_path, spec)
    assert state.spec == spec.model_dump(mode="json")
    assert _resume(spec, state) == []


def test_changed_spec_warns_naming_the_fields_and_continues_with_it(tmp_path):
    state = _saved_state(tmp_path, _spec())
    new = _spec(optim={"lr": 2e-6}, algo={"mini_batches": 2})
    (event,) = _resume(new, state)
    kind, data = event
    assert kind == "warning" and data["step"] == 3
    assert data["changed_fields"] == ["algo.mini_batches", "optim.lr"]
    assert "algo.mini_batches, optim.lr" in data["message"]
    # The run now holds the new spec: its next checkpoint records it (and a resume of that is silent).
    assert state.spec_sha256 == spec_sha256(new) and state.spec["optim"]["lr"] == 2e-6
    assert _resume(new, state) == []


def test_checkpoint_without_a_saved_spec_still_warns(tmp_path):
    state = _saved_state(tmp_path, _spec())
    state.spec = None  # written before the spec was saved: only its hash
    (event,) = _resume(_spec(seed=9), state)
    assert event[0] == "warning" and event[1]["changed_fields"] == [] and "unknown fields" in event[1]["message"]
