"""What a multi-turn environment is to the rollout room: episodes that answer the model's turns.

The trainer owns generation (token ids in, token ids out); an environment owns the episode's
state, its tools, when it ends and (optionally) its reward. The rollout room's multi-turn
driver (`trainer.rollouts.multiturn`) opens one `Episode` per trajectory, asks the engine for
the next turn of every live trajectory in one batched call, hands each turn's text to its
episode, and appends the episode's reply (tool results, observations, a user turn) to the
trajectory as context tokens that carry no loss.

Every method is async: an episode's reply may wait on a sandboxed tool, an HTTP server or a
library's async code, and the driver awaits the replies of all live trajectories of a turn
together. An episode must never raise for something the model did (a malformed tool call, a
tool that fails): it answers with an error message and counts it in `EnvReply.tool_errors`. An
exception out of an episode (the environment itself is broken) ends that trajectory with
reward 0 and its error recorded; the job carries on.

Three ways in implement this: built-in Python tools (`tools_env.py`), `verifiers`
environments (`verifiers_env.py`) and OpenEnv servers (`openenv_env.py`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

Message = dict[str, Any]   # an OpenAI-style chat message: role, content, tool_calls, tool_call_id


@dataclass
class ToolCall:
    """One tool call the model wrote, parsed from its turn (`trainer.rollouts.tool_calls`)."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass
class AssistantTurn:
    """What the model wrote in one turn: its text, and the tool calls parsed from it.

    `parse_error` names what was wrong when the text tried to call a tool and the call could
    not be read (bad JSON, no name): the environment answers with it, the model can retry."""

    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    parse_error: str | None = None
    truncated: bool = False          # cut by the turn's token budget before it ended
    # What the engine sampled, as the driver trains on it (empty when a turn was not sampled,
    # e.g. scripted in a test): the context the turn was sampled from (the opening prompt, every
    # earlier turn and environment reply), the turn's token ids and their log-probs.
    prompt_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    def message(self) -> Message:
        """The turn as a chat message (tool calls in OpenAI's shape)."""
        msg: Message = {"role": "assistant", "content": self.text}
        if self.tool_calls:
            msg["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}}
                                 for c in self.tool_calls]
        return msg


@dataclass
class EnvReply:
    """An episode's answer to one model turn."""

    messages: list[Message] = field(default_factory=list)  # appended to the transcript (role tool/user)
    done: bool = False               # the episode is over (no further model turn)
    reward: float | None = None      # the environment's own reward, when `done` (None: it gives none)
    tool_calls: int = 0              # tool calls answered in this reply
    tool_errors: int = 0             # of which failed: malformed, unknown tool, raised, timed out
    info: dict[str, Any] = field(default_factory=dict)  # anything worth keeping with the sample


@runtime_checkable
class Episode(Protocol):
    """One trajectory's environment state, from its first prompt to its end."""

    async def start(self) -> list[Message]:
        """The opening messages (system, user): the prompt of the trajectory's first turn."""
        ...

    async def step(self, turn: AssistantTurn) -> EnvReply:
        """Answer the model's turn."""
        ...

    async def finish(self, transcript: list[Message]) -> float | None:
        """The environment's reward for the whole episode (None: it gives none). Called once,
        after the last turn, whether the episode ended by `done`, `max_turns` or the budget."""
        ...

    async def close(self) -> None:
        """Release what the episode holds (a sandbox, a server session). Always called."""
        ...


@runtime_checkable
class Environment(Protocol):
    """A kind of episode, built once per job from its spec (`task.env`)."""

    name: str
    tools: list[dict[str, Any]] | None   # OpenAI function schemas for the chat template (None: no tools)

    def episode(self, example: Any, sample: int) -> Episode:
        """A fresh episode for `example` (a task `Example`), the `sample`-th of its N."""
        ...

    def close(self) -> None:
        """Stop what the environment started (sandboxes, sessions); nothing is left running."""
        ...
