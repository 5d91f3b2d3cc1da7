"""OpenAI's RFT dataset rows ({"messages": [...], ...}) next to the {prompt, answer} ones:
upload validation naming the line and the field, the reference answer the verifier reads,
the example the trainer builds (the whole row as the grader's item) and the prompt rendering
(a real tokenizer's chat template; the documented plain text without one)."""
from __future__ import annotations

import io
import json

import pytest
from hypothesis import given, settings, strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from trainer.graders.dataset_check import check_rows_for
from trainer.graders.scorer import example_item
from trainer.spec import DatasetTask, TaskSpec
from trainer.tasks import dataset_task
from trainer.tasks.dataset_task import DatasetFormatError, count_valid_rows, validate_jsonl
from trainer.tasks.messages import parse_messages, plain_text
from trainer.tasks.prompts import PLAIN_INSTRUCTION, render_example

MAX_LINE = 1 << 20
# The shapes of OpenAI's RFT guide: a developer message, content as a string or as parts.
RFT_ROWS = [
    {"messages": [{"role": "developer", "content": "Answer with the number only."},
                  {"role": "user", "content": "What is 2 + 3?"}],
     "reference_answer": "5", "difficulty": "easy"},
    {"messages": [{"role": "user", "content": [{"type": "input_text", "text": "What is "},
                                               {"type": "text", "text": "4 + 4?"}]}],
     "reference_answer": 8},
    {"messages": [{"role": "user", "content": "Name a prime."}],
     "reference_answer": {"any_of": [2, 3, 5]}},
]


def _jsonl(*rows) -> bytes:
    return b"".join((r if isinstance(r, str) else json.dumps(r)).encode() + b"\n" for r in rows)


def _error(rows) -> str:
    with pytest.raises(DatasetFormatError) as exc:
        count_valid_rows(io.BytesIO(_jsonl(*rows)), MAX_LINE)
    return str(exc.value)


def test_rft_rows_upload_beside_prompt_rows():
    rows = [*RFT_ROWS, {"prompt": "1+1?", "answer": 2}]
    assert count_valid_rows(io.BytesIO(_jsonl(*rows)), MAX_LINE) == 4


@pytest.mark.parametrize("bad, want", [
    ({"messages": "hi"}, "line 3: messages: must be a non-empty list"),
    ({"messages": []}, "line 3: messages: must be a non-empty list"),
    ({"messages": ["hi"]}, "line 3: messages[0]: must be an object, got str"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]},
     "line 3: messages[1].role: must be one of system, developer, user, assistant, got 'robot'"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "user"}]},
     "line 3: messages[1].content: is missing"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": 7}]},
     "line 3: messages[1].content: must be a string or a list of text parts"),
    ({"messages": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "line 3: messages[0].content[0].type: 'input_image' is not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "input_text", "text": None}]}]},
     "line 3: messages[0].content[0].text: must be a string"),
    ({"messages": [{"role": "user", "content": [{"type": "input_text"}]}]},
     "line 3: messages[0].content[0].text: must be a string"),
    ({"messages": [{"role": "user", "content": "  "}]}, "line 3: messages: holds no text"),
    ({"reference_answer": "5"}, "line 3: needs a non-empty string field 'prompt' or OpenAI's 'messages'"),
])
def test_a_bad_row_is_named_by_its_line_and_field(bad, want):
    assert _error([RFT_ROWS[0], {"prompt": "x"}, bad]).startswith(want)


def test_the_verifier_reads_answer_else_reference_answer():
    rows = validate_jsonl(_jsonl(*RFT_ROWS[:2], {"prompt": "p", "answer": "1.5", "reference_answer": "r"})
                          .splitlines(), verifier="numeric")
    assert len(rows) == 3
    # A JSON object is a grader's business; the built-in verifier needs a string or a number.
    with pytest.raises(DatasetFormatError, match="line 1: field 'reference_answer' must be a "
                                                  "non-empty string or a number"):
        validate_jsonl(_jsonl(RFT_ROWS[2]).splitlines())
    with pytest.raises(DatasetFormatError, match=r"line 1: needs a field 'answer' \(or 'reference_answer'\)"):
        validate_jsonl(_jsonl({"messages": [{"role": "user", "content": "q"}]}).splitlines())
    with pytest.raises(DatasetFormatError, match="line 1: field 'answer' must be a non-empty"):
        validate_jsonl(_jsonl({"prompt": "q", "answer": "", "reference_answer": "5"}).splitlines())
    # Without the verifier (a grader rewards the job) any reference, or none, is fine.
    assert len(validate_jsonl(_jsonl(RFT_ROWS[2], {"messages": [{"role": "user", "content": "q"}]})
                              .splitlines(), need_answer=False)) == 2


def test_numeric_verifier_checks_the_reference_answer():
    with pytest.raises(DatasetFormatError, match="line 1"):
        validate_jsonl(_jsonl({**RFT_ROWS[0], "reference_answer": "five"}).splitlines(), verifier="numeric")


def test_the_whole_row_is_the_graders_item(tmp_path):
    path = tmp_path / "rft.jsonl"
    path.write_bytes(_jsonl(*RFT_ROWS, {"prompt": "1+1?", "answer": 2, "tests": ["x"]}))
    task = dataset_task.build(DatasetTask(id="ds_x", eval_fraction=0.25), path, seed=0, need_answer=False)
    examples = {ex.question: ex for ex in task.train + task.eval}
    assert set(examples) == {"developer: Answer with the number only.\nuser: What is 2 + 3?",
                             "What is 4 + 4?", "Name a prime.", "1+1?"}
    for row in RFT_ROWS:
        ex = examples[plain_text(parse_messages(row["messages"]))]
        item = example_item(ex)
        assert {k: item[k] for k in row} == row  # every field of the row, unchanged
        assert item["question"] == item["prompt"] == ex.question
    assert examples["What is 4 + 4?"].answer == "8"
    assert examples["Name a prime."].answer == '{"any_of": [2, 3, 5]}'
    assert example_item(examples["1+1?"]) == {"prompt": "1+1?", "question": "1+1?", "answer": "2",
                                             "tests": ["x"]}


def test_duplicate_prompts_are_dropped_across_formats(tmp_path):
    path = tmp_path / "dup.jsonl"
    same = {"messages": [{"role": "user", "content": [{"type": "input_text", "text": "Q?"}]}], "reference_answer": "1"}
    path.write_bytes(_jsonl(same, {**same, "messages": [{"role": "user", "content": "Q?"}]},
                            {"prompt": "Q?", "answer": "1"}, {"prompt": "R?", "answer": "2"}))
    task = dataset_task.build(DatasetTask(id="ds_x"), path, seed=0)
    assert sorted(ex.question for ex in task.train + task.eval) == ["Q?", "R?"]


def _example(row):
    return dataset_task._example(row)


def test_plain_rendering_without_a_chat_template():
    one = _example(RFT_ROWS[1])
    assert render_example(one) == "What is 4 + 4?\n"  # nothing added: the messages are the prompt
    assert render_example(one, tokenizer=object()) == "What is 4 + 4?\n"
    two = _example(RFT_ROWS[0])
    assert render_example(two) == "developer: Answer with the number only.\nuser: What is 2 + 3?\n"
    assert render_example(two, "Q: {question} A:") == ("Q: developer: Answer with the number only.\n"
                                                       "user: What is 2 + 3? A:")
    # A {prompt} row keeps today's rendering.
    assert render_example(_example({"prompt": "1+1?", "answer": 2})) == f"1+1?\n{PLAIN_INSTRUCTION}\n"


def _chat_tokenizer(template: str) -> PreTrainedTokenizerFast:
    """A real fast tokenizer with a jinja chat template (no download)."""
    vocab = {"[UNK]": 0, "hi": 1}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    out = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    out.chat_template = template
    return out


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
NO_SYSTEM = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role "
             "not supported') }}{% endif %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
             "{% if add_generation_prompt %}<assistant>{% endif %}")


def test_chat_template_rendering():
    tok = _chat_tokenizer(CHATML)
    assert render_example(_example(RFT_ROWS[0]), tokenizer=tok) == (
        "<|im_start|>system\nAnswer with the number only.<|im_end|>\n"  # developer -> system
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")
    assert render_example(_example(RFT_ROWS[1]), tokenizer=tok) == (
        "<|im_start|>user\nWhat is 4 + 4?<|im_end|>\n<|im_start|>assistant\n")  # parts joined
    # A template that refuses a system role gets it at the head of the first user turn.
    assert render_example(_example(RFT_ROWS[0]), tokenizer=_chat_tokenizer(NO_SYSTEM)) == (
        "<user>Answer with the number only.\n\nWhat is 2 + 3?<assistant>")


def _check(rows, grader) -> None:
    task = TaskSpec(dataset={"id": "ds_x"}, grader=grader)
    check_rows_for(io.BytesIO(_jsonl(*rows)), task, MAX_LINE)


def test_submission_checks_the_fields_of_the_item_the_grader_sees():
    reads = lambda path: {"type": "string_check", "name": "c", "input": "{{ sample.output_text }}",  # noqa: E731
                          "reference": "{{ " + path + " }}", "operation": "eq"}
    # item.question and item.prompt exist for every row; item.answer where a reference does.
    _check([{"prompt": "p", "answer": 1}, RFT_ROWS[0]], reads("item.question"))
    _check(RFT_ROWS, reads("item.answer"))
    _check(RFT_ROWS, {"type": "verifier", "name": "exact"})
    _check(RFT_ROWS[:2], reads("item.reference_answer"))
    with pytest.raises(ValueError, match="reads item.answer, but dataset row 1 has no field 'answer'"):
        _check([RFT_ROWS[0], {"messages": [{"role": "user", "content": "q"}]}], reads("item.answer"))
    with pytest.raises(ValueError, match="reads item.difficulty, but dataset row 1"):
        _check(RFT_ROWS, reads("item.difficulty"))


# Hostile rows: messages-shaped JSON with wrong types, missing keys, unknown roles and parts.
_LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                  st.text(max_size=6))
_JSON = st.recursive(_LEAF, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                    st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                     max_leaves=6)
_PART = st.one_of(_JSON, st.fixed_dictionaries({"type": st.sampled_from(["input_text", "text", "input_image", 3]),
                                                "text": st.one_of(st.text(max_size=8), _JSON)}))
_MESSAGE = st.one_of(_JSON, st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(["system", "developer", "user", "assistant", "tool"]), _JSON)},
    optional={"content": st.one_of(st.text(max_size=8), st.lists(_PART, max_size=3), _JSON)}))
_ROW = st.one_of(_JSON, st.fixed_dictionaries(
    {"messages": st.one_of(st.lists(_MESSAGE, max_size=4), _JSON)},
    optional={"reference_answer": _JSON, "answer": _JSON, "prompt": _JSON}))


@settings(max_examples=300, deadline=None)
@given(st.lists(_ROW, min_size=1, max_size=4))
def test_hostile_rows_are_accepted_and_render_or_are_refused_by_line(rows):
    data = b"".join(json.dumps(r).encode() + b"\n" for r in rows)  # a str row too is JSON here
    try:
        count = count_valid_rows(io.BytesIO(data), MAX_LINE)
    except DatasetFormatError as exc:
        assert 1 <= exc.line_no <= len(rows) and str(exc).startswith(f"line {exc.line_no}: ")
        return
    assert count == len(rows)
    for row in rows:
        ex = dataset_task._example(row)
        prompt = render_example(ex)
        assert prompt.endswith("\n") and ex.question.strip()
        assert example_item(ex)["question"] == ex.question
