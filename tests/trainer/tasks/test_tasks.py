"""Task building (reasoning-gym and JSONL datasets), JSONL validation and prompt rendering."""
from __future__ import annotations

import json

import pytest

from trainer.spec import DatasetTask, ReasoningGymTask, TaskSpec
from trainer.tasks import build_task, dataset_task, reasoning_gym_task
from trainer.tasks.dataset_task import DatasetFormatError, validate_jsonl
from trainer.tasks.prompts import PLAIN_INSTRUCTION, extract_answer, render_prompt, target_completion
from trainer.tasks.scoring_worker import get_verifier, score_item

CHAIN_SUM = ReasoningGymTask(
    name="chain_sum", config={"min_terms": 2, "max_terms": 3, "max_digits": 2},
    train_size=300, eval_size=50)


@pytest.fixture(scope="module")
def chain_sum():
    return reasoning_gym_task.build(CHAIN_SUM, seed=3)


# ----------------------------------------------------------------------------- reasoning gym

def test_reasoning_gym_build_is_deterministic_in_seed(chain_sum):
    again = reasoning_gym_task.build(CHAIN_SUM, seed=3)
    assert again.train == chain_sum.train and again.eval == chain_sum.eval
    other = reasoning_gym_task.build(CHAIN_SUM, seed=4)
    assert other.train != chain_sum.train


def test_reasoning_gym_splits_are_disjoint_and_sized(chain_sum):
    assert len(chain_sum.train) == 300 and len(chain_sum.eval) == 50
    train_q = {e.question for e in chain_sum.train}
    eval_q = [e.question for e in chain_sum.eval]
    assert not train_q & set(eval_q)
    assert len(set(eval_q)) == len(eval_q)
    assert chain_sum.verifier_spec.kind == "reasoning_gym"


def test_tiny_task_space_moves_questions_out_of_train():
    # 1-digit, 2-term sums: far fewer distinct questions than train_size + eval_size.
    spec = ReasoningGymTask(name="chain_sum", config={"min_terms": 2, "max_terms": 2, "max_digits": 1},
                            train_size=2000, eval_size=40)
    task = reasoning_gym_task.build(spec, seed=0)
    assert len(task.eval) == 40
    assert not {e.question for e in task.train} & {e.question for e in task.eval}
    assert task.train


def test_chain_sum_scoring(chain_sum):
    verifier = get_verifier(chain_sum.verifier_spec)
    ex = chain_sum.eval[0]
    item = lambda text: (text, ex.answer, ex.payload)  # noqa: E731
    assert score_item(verifier, item(f"thinking... <answer>{ex.answer}</answer>"), None) == (1.0, 0)
    wrong = str(int(ex.answer) + 1)
    assert score_item(verifier, item(f"<answer>{wrong}</answer>"), None) == (0.0, 0)
    assert score_item(verifier, item(ex.answer), None) == (0.0, 0)  # no tag, no credit
    # the last tag counts
    assert score_item(verifier, item(f"<answer>{wrong}</answer> no, <answer>{ex.answer}</answer>"), None)[0] == 1.0


def test_build_task_dispatch(tmp_path):
    task = build_task(TaskSpec(reasoning_gym=CHAIN_SUM), seed=3)
    assert task.name == "chain_sum"
    spec = TaskSpec(dataset=DatasetTask(id="ds_x"))
    with pytest.raises(ValueError, match="dataset_path"):
        build_task(spec, seed=0, dataset_path=None)
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"q{i}", "answer": i}) for i in range(10)))
    assert len(build_task(spec, seed=0, dataset_path=path).eval) == 1


# ----------------------------------------------------------------------------- JSONL datasets

def _write(tmp_path, rows):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_dataset_split_is_deterministic_and_disjoint(tmp_path):
    rows = [{"prompt": f"q{i}", "answer": str(i), "topic": "t"} for i in range(100)]
    spec = DatasetTask(id="ds_1", eval_fraction=0.1)
    task = dataset_task.build(spec, _write(tmp_path, rows), seed=7)
    assert len(task.train) == 90 and len(task.eval) == 10
    assert not {e.question for e in task.train} & {e.question for e in task.eval}
    assert task.train[0].payload == {"topic": "t"}
    again = dataset_task.build(spec, _write(tmp_path, rows), seed=7)
    assert again.train == task.train and again.eval == task.eval
    assert dataset_task.build(spec, _write(tmp_path, rows), seed=8).eval != task.eval


def test_duplicate_prompts_never_straddle_the_split(tmp_path):
    rows = [{"prompt": f"q{i % 20}", "answer": str(i % 20)} for i in range(200)]  # each 10 times
    task = dataset_task.build(DatasetTask(id="ds_1", eval_fraction=0.25), _write(tmp_path, rows), seed=1)
    assert len(task.train) + len(task.eval) == 20
    assert not {e.question for e in task.train} & {e.question for e in task.eval}


def test_dataset_split_keeps_one_of_each(tmp_path):
    spec = DatasetTask(id="ds_1", eval_fraction=0.9)
    task = dataset_task.build(spec, _write(tmp_path, [{"prompt": "a", "answer": 1}, {"prompt": "b", "answer": 2}]), 0)
    assert len(task.train) == 1 and len(task.eval) == 1
    with pytest.raises(ValueError, match="at least 2"):
        dataset_task.build(spec, _write(tmp_path, [{"prompt": "a", "answer": 1}]), 0)


def test_numbers_become_text(tmp_path):
    task = dataset_task.build(DatasetTask(id="d", eval_fraction=0.5),
                              _write(tmp_path, [{"prompt": "a", "answer": 3}, {"prompt": "b", "answer": 0.5}]), 0)
    assert sorted(e.answer for e in task.train + task.eval) == ["0.5", "3"]


@pytest.mark.parametrize("bad, message", [
    ("not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"answer": "1"}', "prompt"),
    ('{"prompt": 3, "answer": "1"}', "prompt"),
    ('{"prompt": "q"}', "answer"),
    ('{"prompt": "q", "answer": true}', "answer"),
    ('{"prompt": "q", "answer": ["1"]}', "answer"),
    ('{"prompt": "q", "answer": NaN}', "finite"),
])
def test_validate_jsonl_reports_the_line(bad, message):
    lines = ['{"prompt": "a", "answer": "1"}', "", bad, '{"prompt": "b", "answer": 2}']
    with pytest.raises(DatasetFormatError, match=message) as info:
        validate_jsonl(lines)
    assert info.value.line_no == 3
    assert str(info.value).startswith("line 3:")


def test_validate_jsonl_bytes_blank_lines_and_empty():
    rows = validate_jsonl([b'{"prompt": "a", "answer": 1, "x": 2}\n', b"\n", b'{"prompt": "b", "answer": "z"}'])
    assert rows == [{"prompt": "a", "answer": 1, "x": 2}, {"prompt": "b", "answer": "z"}]
    with pytest.raises(DatasetFormatError) as info:
        validate_jsonl(["", "  "])
    assert info.value.line_no == 0
    with pytest.raises(DatasetFormatError) as info:
        validate_jsonl([b'{"prompt": "a", "answer": 1}', b"\xff\xfe"])
    assert info.value.line_no == 2


def test_validate_jsonl_checks_answers_for_the_verifier():
    with pytest.raises(DatasetFormatError, match="not a number") as info:
        validate_jsonl(['{"prompt": "a", "answer": "3/4"}', '{"prompt": "b", "answer": "x"}'], verifier="numeric")
    assert info.value.line_no == 2
    with pytest.raises(DatasetFormatError, match="regular expression"):
        validate_jsonl(['{"prompt": "a", "answer": "(a"}'], verifier="regex")


# ----------------------------------------------------------------------------- prompts

class _ChatTokenizer:
    chat_template = "x"

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt and not tokenize
        return "|".join(f"{m['role']}:{m['content']}" for m in messages) + "|assistant:"


class _NoSystemTokenizer(_ChatTokenizer):
    def apply_chat_template(self, messages, **kw):
        if messages[0]["role"] == "system":
            raise ValueError("System role not supported")
        return super().apply_chat_template(messages, **kw)


def test_render_prompt_with_template_substitutes_only_question():
    out = render_prompt("2+2?", "Q: {question} {not_a_field} \\boxed{} {{x}}", _ChatTokenizer())
    assert out == "Q: 2+2? {not_a_field} \\boxed{} {{x}}"


def test_render_prompt_plain_and_chat():
    assert render_prompt("2+2?") == f"2+2?\n{PLAIN_INSTRUCTION}\n"
    assert render_prompt("2+2?", tokenizer=object()) == f"2+2?\n{PLAIN_INSTRUCTION}\n"
    chat = render_prompt("2+2?", tokenizer=_ChatTokenizer())
    assert chat.startswith("system:") and "<answer></answer>" in chat and chat.endswith("user:2+2?|assistant:")
    merged = render_prompt("2+2?", tokenizer=_NoSystemTokenizer())
    assert merged.startswith("user:") and "<answer>" in merged and "2+2?" in merged


def test_target_completion_round_trips():
    assert target_completion("-12") == "<answer>-12</answer>"
    assert extract_answer("so " + target_completion(" -12 ")) == "-12"
    assert extract_answer("no tags here") is None
