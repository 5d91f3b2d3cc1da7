"""Prompt rendering and answer extraction: the one place that knows about <answer> tags.

Every task asks the model for its final answer inside <answer></answer>, and every verifier
reads the last such tag (reasoning-gym's own convention), so prompts and extraction must
agree; both live here.
"""
from __future__ import annotations

from typing import Any

ANSWER_TAG = "answer"

# For chat models (a system message): short, because the instruction is in every prompt.
DEFAULT_INSTRUCTION = (
    "Solve the problem. You may think first, but put your final answer "
    "inside <answer></answer>, e.g. <answer>42</answer>."
)

# For models without a chat template, mainly the character-level builtin:tiny model: every
# prompt character costs a forward position for each of the N (up to 512) samples.
PLAIN_INSTRUCTION = "Answer in <answer></answer>."


def render_prompt(question: str, template: str | None = None, tokenizer: Any = None) -> str:
    """The text handed to the engine for `question`.

    With a template, `{question}` is substituted and nothing else (str.format would choke on
    the other braces a LaTeX or JSON template holds); the template is used verbatim, so a
    chat model's template must carry its own chat markup. Without one, a chat model gets the
    instruction as a system message and the question as the user turn; anything else gets
    the compact plain format.
    """
    if template is not None:
        return template.replace("{question}", question)
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return _chat_prompt(question, tokenizer)
    return f"{question}\n{PLAIN_INSTRUCTION}\n"


def render_example(example: Any, template: str | None = None, tokenizer: Any = None) -> str:
    """The text handed to the engine for a task's `Example`.

    An OpenAI RFT row (a dataset row with `messages`, kept whole in the payload) is its own
    prompt: the messages through the chat template where the tokenizer has one, else their
    plain text (trainer.tasks.messages.plain_text) and a newline; nothing is added, so a
    messages dataset rewarded by the built-in verifier asks for <answer></answer> itself. With
    a template, `{question}` is that plain text. Any other example: `render_prompt`."""
    messages = example.payload.get("messages") if isinstance(example.payload, dict) else None
    if messages is None:
        return render_prompt(example.question, template, tokenizer)
    if template is not None:
        return template.replace("{question}", example.question)
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        from trainer.tasks.messages import chat_prompt, parse_messages

        return chat_prompt(parse_messages(messages), tokenizer)
    return f"{example.question}\n"


def _chat_prompt(question: str, tokenizer: Any) -> str:
    messages = [
        {"role": "system", "content": DEFAULT_INSTRUCTION},
        {"role": "user", "content": question},
    ]
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except Exception:  # noqa: BLE001 - some templates (e.g. Gemma's) refuse a system role
        merged = [{"role": "user", "content": f"{DEFAULT_INSTRUCTION}\n\n{question}"}]
        return tokenizer.apply_chat_template(merged, add_generation_prompt=True, tokenize=False)


def target_completion(answer: str) -> str:
    """The ideal completion for `answer` (the builtin:tiny model's warm-start SFT target)."""
    return f"<{ANSWER_TAG}>{answer}</{ANSWER_TAG}>"


def extract_answer(completion: str) -> str | None:
    """The stripped content of the last <answer>...</answer>, or None when there is none."""
    from reasoning_gym.utils import extract_answer as _extract

    return _extract(completion, tag_name=ANSWER_TAG)
