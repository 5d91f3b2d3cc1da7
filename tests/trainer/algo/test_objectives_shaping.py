"""The spec's objective fields, DAPO's overlong penalty and the difficulty filter across steps."""
import pytest
import torch
from pydantic import ValidationError

from trainer.algo.advantages import ADVANTAGES
from trainer.algo.difficulty import DifficultyFilter, make_difficulty_filter, record_draws
from trainer.algo.shaping import overlong_penalty
from trainer.prompt_stream import PromptStream
from trainer.spec import JobSpec, spec_errors

RG = {"reasoning_gym": {"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 3, "max_digits": 2}}}


def _spec(**algo):
    return JobSpec.model_validate({"name": "t", "task": RG, "rollout": {"max_new_tokens": 64}, "algo": algo})


def _refused(**algo) -> list[str]:
    with pytest.raises(ValidationError) as exc:
        _spec(**algo)
    return [e["field"] for e in spec_errors(exc.value)]


def test_spec_defaults_are_off_and_the_old_objective():
    s = _spec()
    assert (s.algo.loss, s.algo.overlong, s.algo.difficulty_filter, s.model.fp32_lm_head) == ("ppo", None, None, False)


def test_dr_grpo_refuses_the_group_std_advantage():
    assert _refused(loss="dr_grpo", advantage="grpo") == ["algo.advantage"]
    assert _spec(loss="dr_grpo", advantage="group_mean").algo.advantage == "group_mean"
    assert _spec(loss="dr_grpo").algo.advantage == "reinforce_pp_baseline"
    assert _refused(loss="reinforce") == ["algo.loss"]


def test_overlong_buffer_must_leave_room():
    assert _refused(overlong={"buffer": 64}) == ["algo.overlong.buffer"]
    assert _spec(overlong={"buffer": 16}).algo.overlong.penalty == 1.0


def test_group_mean_advantage_has_no_std_division():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    group = torch.tensor([0, 0, 0, 0, 1, 1])
    # group 0: mean 0.25; group 1: mean 1 (no spread: 0, not 0/0)
    assert ADVANTAGES["group_mean"](rewards, group).tolist() == [0.75, -0.25, -0.25, -0.25, 0.0, 0.0]


def test_overlong_penalty_at_the_buffer_edges():
    # L = 100, buffer 20: no penalty up to 80 tokens, then -penalty x (l - 80) / 20.
    lengths = torch.tensor([1, 80, 81, 90, 99, 100])
    got = overlong_penalty(lengths, 100, 20, 1.0)
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, -0.05, -0.5, -0.95, -1.0]))
    torch.testing.assert_close(overlong_penalty(lengths, 100, 20, 0.5), got * 0.5)


def test_a_prompt_always_solved_is_retired_after_the_window():
    f = DifficultyFilter(window=2, retire_unsolved=False, n_prompts=10, min_active=3)
    assert f.record([4, 5, 6], [1.0, 0.0, 0.5]) == 0  # one draw: under the window
    assert f.record([4, 5, 6], [1.0, 0.0, 1.0]) == 1  # 4 solved twice; 6 was not always solved
    assert f.is_retired(4) and not f.is_retired(5) and not f.is_retired(6)
    assert f.metrics() == {"prompts_retired": 1, "prompts_retired_frac": 0.1}
    # the window slides: 6's last two draws are 1.0 and now 1.0 again
    assert f.record([6], [1.0]) == 1 and f.is_retired(6)
    # a retired prompt's later results change nothing
    assert f.record([4], [0.0]) == 0 and f.is_retired(4)


def test_never_solved_prompts_are_retired_only_when_asked():
    keep = DifficultyFilter(window=1, retire_unsolved=False, n_prompts=10, min_active=1)
    drop = DifficultyFilter(window=1, retire_unsolved=True, n_prompts=10, min_active=1)
    assert keep.record([1], [0.0]) == 0 and drop.record([1], [0.0]) == 1


def test_retiring_stops_at_the_active_floor_and_the_stream_skips_retired():
    f = DifficultyFilter(window=1, retire_unsolved=False, n_prompts=5, min_active=2)
    assert f.record([0, 1, 2, 3, 4], [1.0] * 5) == 3  # 2 stay to fill a step
    stream = PromptStream(range(5), seed=0)
    drawn = stream.take(6, f.is_retired)
    assert set(drawn) == {3, 4} and len(drawn) == 6
    state = f.state_dict()
    g = DifficultyFilter(window=1, retire_unsolved=False, n_prompts=5, min_active=2)
    g.load_state_dict(state)
    assert g.retired == f.retired


def test_record_draws_uses_each_groups_solve_rate():
    f = DifficultyFilter(window=1, retire_unsolved=True, n_prompts=100, min_active=1)
    # drawn prompts 7, 9, 11; samples grouped by the prompt's position in the round
    correct = torch.tensor([True, True, False, True, False, False])
    group = torch.tensor([0, 0, 1, 1, 2, 2])
    assert record_draws(f, [7, 9, 11], correct, group) == 2
    assert f.retired == {7, 11}


def test_filter_built_from_the_spec():
    s = _spec(difficulty_filter={"window": 3})
    f = make_difficulty_filter(s, 1000)
    assert (f.window, f.retire_unsolved, f.min_active) == (3, False, 64)
    assert make_difficulty_filter(_spec(), 1000) is None
    f.record([3, 4], [1.0, 0.5])
    f.record([3], [1.0])
    f.record([3], [1.0])
    resumed = make_difficulty_filter(s, 1000, f.state_dict())  # a checkpoint's TrainerState.difficulty
    assert resumed.retired == {3} and list(resumed.history[4]) == [0.5]
