"""Tokenizers with real chat templates built here, no download: the character-level
builtin:tiny vocabulary plus `<|im_start|>` / `<|im_end|>` and a template shaped like Qwen3's
(tools in the system turn, tool results as a user turn of <tool_response> blocks, tool calls
re-rendered from their structured form, and the <think> block of every assistant turn before
the last user message dropped) -- the re-templating that changes what the model sampled."""
from __future__ import annotations

QWEN3_LIKE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- set ns = namespace(last_query=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}"
    "{{- '<|im_start|>user\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- elif m.role == 'assistant' %}"
    "{%- set content = m.content %}{%- set reasoning = '' %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- if '<tool_call>' in content %}{%- set content = content.split('<tool_call>')[0].rstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if loop.index0 > ns.last_query and reasoning %}"
    "{{- '<think>\\n' + reasoning + '\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{{- content }}"
    "{%- if m.tool_calls %}{%- for tc in m.tool_calls %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + tc.function.name + '\", \"arguments\": ' + (tc.function.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# A template that knows only user and assistant turns and never reads `tools` (as some older
# chat models' do): tool results must go in as user turns, the tools into the system turn.
USER_ASSISTANT_ONLY = (
    "{%- for m in messages %}"
    "{%- if m.role not in ['system', 'user', 'assistant'] %}"
    "{{- raise_exception('only system, user and assistant roles are supported') }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def chat_tokenizer(template: str = QWEN3_LIKE):
    """The builtin:tiny tokenizer with chat specials, `<|im_end|>` as its EOS, and `template`."""
    from trainer.models.tiny import build_tokenizer

    tok = build_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = template
    return tok
