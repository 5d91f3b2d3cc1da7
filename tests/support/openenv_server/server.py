"""A small OpenEnv server written with openenv-core's own classes: a number-guessing game.

Run with a Python that has openenv-core (tests/support/openenv_server/__init__.py makes one):
`python tests/support/openenv_server/server.py --port 8123 [--max-sessions 8]`.
Imports nothing of this project: it stands for a server someone else wrote.

The game: reset(seed) draws a secret from 1 to 100 (random.Random(seed)); each step's `guess` is
answered "higher", "lower" or "correct" (a `question` given to reset is the opening instead
of the default one); a correct guess pays 1.0 and ends the episode; every
other step pays -0.1, and the seventh wrong guess ends it. The observation has one text field
(`message`) and a number (`guesses_left`), as echo_env's has, so a text mapping works unset.

Faults for the client's tests, asked for by the guess text: "!crash" raises in step (the
server answers EXECUTION_ERROR: its HTTP 500), "!flaky" raises on the first try only, "!hang"
sleeps past any client timeout, "!big" answers a megabyte. A WebSocket handshake carrying the
headers `x-reject-key: <key>` and `x-reject-first: <k>` is answered with HTTP 503 the first k
times that key is seen (a proxy in front of a server that is starting), so one server serves
every test.
"""
from __future__ import annotations

import argparse
import random
import time
from typing import Any, Optional

import sys

# The optional web UI (gradio) is not served; blocking its import halves the start time
# (openenv.core.env_server imports it inside a try that expects it may be missing).
sys.modules["gradio"] = None  # type: ignore[assignment]

import uvicorn  # noqa: E402
from openenv.core.env_server import Action, Environment, Observation, State, create_app

MAX_WRONG = 7   # binary search over 1..100 needs 7 guesses at most


class GuessAction(Action):
    guess: str


class GuessObservation(Observation):
    message: str
    guesses_left: int


class GuessEnvironment(Environment[GuessAction, GuessObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State()
        self.secret = 0
        self.wrong = 0
        self.flaked = False

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None,
              low: int = 1, high: int = 100, question: Optional[str] = None, **kwargs: Any) -> GuessObservation:
        self.secret = random.Random(seed).randint(low, high)
        self.low, self.high = low, high
        self.wrong = 0
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(message=question or f"I picked a number from {low} to {high}. Guess it.",
                                guesses_left=MAX_WRONG)

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        text = action.guess.strip()
        if text == "!crash":
            raise RuntimeError("the game broke")
        if text == "!flaky" and not self.flaked:
            self.flaked = True
            raise RuntimeError("a passing fault")
        if text == "!hang":
            time.sleep(30)
        if text == "!big":
            return GuessObservation(message="x" * 1_000_000, guesses_left=MAX_WRONG - self.wrong)
        digits = "".join(c for c in text if c.isdigit() or c == "-")
        try:
            guess = int(digits)
        except ValueError:
            guess = None
        if guess == self.secret:
            return GuessObservation(message="correct", guesses_left=MAX_WRONG - self.wrong, done=True, reward=1.0)
        self.wrong += 1
        hint = "not a number" if guess is None else ("higher" if guess < self.secret else "lower")
        return GuessObservation(message=hint, guesses_left=MAX_WRONG - self.wrong,
                                done=self.wrong >= MAX_WRONG, reward=-0.1)

    @property
    def state(self) -> State:
        return self._state


class RejectFirst:
    """ASGI middleware: the handshakes the module's docstring says get HTTP 503."""

    def __init__(self, app):
        self.app, self.seen = app, {}

    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers") or [])
        key = headers.get(b"x-reject-key")
        if scope["type"] == "websocket" and key is not None:
            self.seen[key] = self.seen.get(key, 0) + 1
            if self.seen[key] > int(headers.get(b"x-reject-first", b"0")):
                return await self.app(scope, receive, send)
            await receive()   # websocket.connect
            await send({"type": "websocket.http.response.start", "status": 503, "headers": []})
            await send({"type": "websocket.http.response.body", "body": b"starting"})
            return
        await self.app(scope, receive, send)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--max-sessions", type=int, default=16)
    a = p.parse_args()
    app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess",
                     max_concurrent_envs=a.max_sessions)
    uvicorn.run(RejectFirst(app), host="127.0.0.1", port=a.port, log_level="warning",
                ws="websockets")


if __name__ == "__main__":
    main()
