"""`task.env.type: openenv`: an OpenEnv server the operator lists, one WebSocket session per episode.

Which servers. The operator lists them by name in BRORL_OPENENV_SERVERS, a JSON object
`{"name": "http://host:port"}` or `{"name": {"url": ..., <mapping and limits>}}` (`ServerConfig`;
docs/configuration.md and docs/openenv.md). A job names one in `task.env.name`; a URL
never comes from a tenant (a name that is not listed is an error naming the setting), so a job
cannot make the worker open connections of its choosing.

The protocol (openenv-core 0.2 and later, read from 0.3.0's `HTTPEnvServer`). Its HTTP
`POST /reset` and `POST /step` build a fresh environment for every request and close it after
that one call: they hold no episode, so a step never sees the state its reset made. Episodes
live in WebSocket sessions at `/ws`: each connection gets its own environment instance (up to
the server's `max_concurrent_envs`), and the client sends `{"type": "reset", "data": {seed, ...}}`,
`{"type": "step", "data": <action fields>}` and `{"type": "close"}`, each answered by
`{"type": "observation", "data": {"observation": {...}, "reward": r, "done": d}}` or
`{"type": "error", "data": {"message", "code"}}`. So each episode here is one session: `start()`
connects and resets, `step()` steps, `close()` closes; concurrent episodes never share an
environment. HTTP (httpx) is used at build only: `/health` (the server answers) and `/schema`
(the action's fields, to map the model's text onto them).

Text in, text out. An action is `{action_field: <the model's turn text>}` merged over
`action_defaults`; with `action_format: "json"` the model writes the action itself as a JSON
object (the last one in its turn). When `action_field` is not given, the action schema's only
string field is used (OpenEnv's echo_env: `message`); an action with none or several needs
the setting. An observation becomes one user message: its `observation_field`, else its only
string field, else the whole observation as JSON; cut to `max_observation_chars`.

Rewards. `finish()` gives the sum of the step rewards (`reward: "sum"`, the default: games that
pay per step and ones that pay once at the end both work) or the last one (`"last"`: a server
that reports a running score); None when no step carried a reward.

Errors (as Azure's agentic RFT and HTTP itself draw the line):
- an action the server rejects (`VALIDATION_ERROR`, the 422 of its HTTP step; or JSON the
  model wrote that does not parse) is the model's doing: it is answered with an error message
  the model reads, counted in `EnvReply.tool_errors`, and the episode goes on;
- the server failing (`EXECUTION_ERROR`: its environment raised, the 500 of its HTTP step; no
  room for a session; a refused or failed connection, a 5xx at the handshake) is retried
  `retries` times with backoff, then the episode raises `OpenEnvError` (the driver ends that
  trajectory with its error; the job goes on);
- no answer within `timeout_s`, or a dropped connection, raises at once: the session's state
  is unknown, and the protocol has no request ids to match a late answer to its request.

Event loop. Sessions belong to one event loop of the environment's own (a daemon thread);
the episode's async methods hand their work to it and await the result. So the driver may run
its turns in one loop or start a new one per turn, and `Environment.close()` (sync) can close
every session still open: nothing is left running on the server either.
"""
from __future__ import annotations

import asyncio
import json
import math
import random
import re
import time
import zlib
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trainer.rollouts.environments.loop_thread import LoopThread
from trainer.rollouts.environments.base import AssistantTurn, EnvReply, Message
from trainer.tasks.base import Example, Task, VerifierSpec

SETTING = "BRORL_OPENENV_SERVERS"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_MESSAGE_BYTES = 16 * 2**20     # one WebSocket message from a server
RESERVED_ARGS = ("train_size", "eval_size")   # task.env.args keys read here, not sent to reset
DEFAULT_TRAIN_SIZE, DEFAULT_EVAL_SIZE = 256, 32
MAX_EXAMPLES = 100_000
SEED_RANGE = 2**31                  # reset seeds: openenv's ResetRequest wants seed >= 0
BACKOFF_S = 0.25                    # first retry's wait; doubled each time
CLOSE_TIMEOUT_S = 5.0


class OpenEnvError(RuntimeError):
    """The server (not the model) failed: the episode ends with this error."""


class ServerConfig(BaseModel):
    """One entry of BRORL_OPENENV_SERVERS (a bare URL string is `{"url": ...}`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    action_field: str | None = None          # the action field that carries the model's text
    action_format: Literal["text", "json"] = "text"
    action_defaults: dict[str, Any] = Field(default_factory=dict)   # fixed fields of every action
    observation_field: str | None = None     # the observation field shown to the model
    reward: Literal["sum", "last"] = "sum"
    timeout_s: float = Field(60.0, gt=0, le=3600)       # one reset or step
    connect_timeout_s: float = Field(10.0, gt=0, le=600)
    retries: int = Field(3, ge=0, le=10)
    max_observation_chars: int = Field(16_000, ge=100, le=1_000_000)
    headers: dict[str, str] = Field(default_factory=dict)   # e.g. Authorization for a private Space

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https", "ws", "wss") or not parts.hostname:
            raise ValueError("needs an http(s):// or ws(s):// URL with a host")
        if parts.query or parts.fragment:
            raise ValueError("takes no query or fragment")
        return v.rstrip("/")

    def http_url(self, path: str) -> str:
        p = urlsplit(self.url)
        scheme = {"ws": "http", "wss": "https"}.get(p.scheme, p.scheme)
        return urlunsplit((scheme, p.netloc, p.path.rstrip("/") + path, "", ""))

    def ws_url(self) -> str:
        p = urlsplit(self.url)
        scheme = {"http": "ws", "https": "wss"}.get(p.scheme, p.scheme)
        return urlunsplit((scheme, p.netloc, p.path.rstrip("/") + "/ws", "", ""))


def parse_servers(raw: str | dict | None) -> dict[str, ServerConfig]:
    """BRORL_OPENENV_SERVERS read: name -> config; a bad value is a ValueError naming it."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    try:
        data = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError as exc:
        raise ValueError(f"{SETTING} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f'{SETTING} must be a JSON object {{"name": "http://host:port", ...}}')
    servers = {}
    for name, entry in data.items():
        if not NAME.match(name):
            raise ValueError(f"{SETTING}: server name {name!r} must be letters, digits, '.', '_' or '-'")
        try:
            servers[name] = ServerConfig(url=entry) if isinstance(entry, str) else ServerConfig.model_validate(entry)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(x) for x in err["loc"])
            raise ValueError(f"{SETTING}: server {name!r}: {where}: {err['msg']}") from None
    return servers


def _get(spec: Any, name: str, default: Any = None) -> Any:
    if isinstance(spec, dict):
        return spec.get(name, default)
    return getattr(spec, name, default)


def server_config(name: str | None, settings: Any) -> ServerConfig:
    """The listed server a job names; an unknown or missing name is a ValueError naming the setting."""
    servers = parse_servers(_get(settings, "openenv_servers", ""))
    if not name:
        raise ValueError(f"task.env.name: an openenv environment names one of the servers in {SETTING}")
    if name not in servers:
        listed = ", ".join(sorted(servers)) or "none listed"
        raise ValueError(f"task.env.name: {str(name)[:100]!r} is not an OpenEnv server listed in "
                         f"{SETTING} ({listed}); a job names a listed server, never a URL")
    return servers[name]


def check(env_spec: Any, settings: Any) -> None:
    """The submission check: the name is listed and the arguments are sizes and JSON."""
    server_config(_get(env_spec, "name"), settings)
    _sizes(env_spec)
    _reset_args(env_spec)


def _sizes(env_spec: Any) -> tuple[int, int]:
    args = _get(env_spec, "args") or {}
    sizes = []
    for key, default in zip(RESERVED_ARGS, (DEFAULT_TRAIN_SIZE, DEFAULT_EVAL_SIZE)):
        value = _get(env_spec, key, None)
        value = args.get(key, default) if value is None else value
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_EXAMPLES:
            raise ValueError(f"task.env.args.{key}: a whole number from 0 to {MAX_EXAMPLES}")
        sizes.append(value)
    if sizes[0] < 1:
        raise ValueError("task.env.args.train_size: at least 1")
    return sizes[0], sizes[1]


def _reset_args(env_spec: Any) -> dict[str, Any]:
    args = {k: v for k, v in (_get(env_spec, "args") or {}).items() if k not in RESERVED_ARGS}
    for key in ("seed", "episode_id"):
        if key in args:
            raise ValueError(f"task.env.args.{key}: set per episode by the trainer")
    try:
        json.dumps(args, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"task.env.args: not JSON: {exc}") from None
    return args


def task(env_spec: Any, settings: Any, seed: int) -> Task:
    """The job's examples: `train_size` + `eval_size` distinct reset seeds drawn from the job's
    seed (task.env.args, defaults 256 and 32); each example's prompt is what its reset answers."""
    name = _get(env_spec, "name")
    server_config(name, settings)
    n_train, n_eval = _sizes(env_spec)
    seeds = random.Random(seed).sample(range(SEED_RANGE), n_train + n_eval)

    def example(s: int) -> Example:
        # The question is a label for logs and samples; the real prompt comes from reset.
        return Example(question=f"{name} reset seed {s}", answer="", payload={"openenv": name, "seed": s})

    return Task(name=f"openenv:{name}", train=[example(s) for s in seeds[:n_train]],
                eval=[example(s) for s in seeds[n_train:]],
                verifier_spec=VerifierSpec.of("callable", ref=f"{__name__}:no_reference"))


def no_reference(extracted: str, answer: str, payload: dict) -> float:
    """The built-in verifier of an OpenEnv task: there is no reference answer to check, so it
    gives 0; the reward is the server's (`reward: env`) or the task's grader's."""
    return 0.0


# ----------------------------------------------------------------------------- the mapping


def _schema_text_field(schema: dict[str, Any]) -> str | None:
    props = {k: v for k, v in (schema.get("properties") or {}).items() if k != "metadata"}
    strings = [k for k, v in props.items() if v.get("type") == "string"]
    return strings[0] if len(strings) == 1 else None


def _last_json_object(text: str) -> dict[str, Any] | None:
    """The last top-level JSON object in `text` (one nested in another is part of it)."""
    decoder = json.JSONDecoder()
    found, i = None, text.find("{")
    while i != -1:
        try:
            found, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            end = i + 1
        i = text.find("{", end)
    return found


def observation_text(observation: Any, field: str | None, limit: int) -> str:
    """What the model reads of an observation (see the module's docstring)."""
    value: Any = observation
    if isinstance(observation, dict):
        strings = [k for k, v in observation.items() if isinstance(v, str)]
        if field is not None and field in observation:
            value = observation[field]
        elif field is None and len(strings) == 1:
            value = observation[strings[0]]
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    if len(text) > limit:
        text = text[:limit] + f"\n[... {len(text) - limit} more characters cut]"
    return text


def _reward(value: Any) -> float | None:
    if value is None:
        return None
    try:
        r = float(value)
    except (TypeError, ValueError):
        return None
    return r if math.isfinite(r) else None


# ----------------------------------------------------------------------------- sessions


class _Retryable(Exception):
    """A failure of the server worth another try (5xx, no capacity, refused connection)."""


class _Lost(_Retryable):
    """The connection closed under a request (a step cannot be retried on another session)."""


class _Rejected(Exception):
    """The server rejected the action (the model's doing)."""


class _Session:
    """One WebSocket session (one environment instance on the server); lives on the env's loop."""

    def __init__(self, server: str, cfg: ServerConfig):
        self.server, self.cfg, self.ws = server, cfg, None

    async def connect(self) -> None:
        from websockets.asyncio.client import connect
        from websockets.exceptions import InvalidStatus

        try:
            self.ws = await connect(self.cfg.ws_url(), open_timeout=self.cfg.connect_timeout_s,
                                    additional_headers=self.cfg.headers or None, max_size=MAX_MESSAGE_BYTES,
                                    proxy=None, compression=None, user_agent_header="brorl-openenv")
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status >= 500 or status == 429:
                raise _Retryable(f"the WebSocket handshake got HTTP {status}") from None
            raise OpenEnvError(f"OpenEnv server {self.server!r} refused a session with HTTP {status} at "
                               "/ws (sessions need openenv-core 0.2 or later)") from None
        except (OSError, asyncio.TimeoutError, TimeoutError) as exc:
            raise _Retryable(f"cannot connect: {type(exc).__name__}: {exc}") from None

    async def request(self, message: dict[str, Any]) -> dict[str, Any]:
        from websockets.exceptions import ConnectionClosed

        if self.ws is None:
            raise _Lost("the session was abandoned by an earlier request")
        try:
            try:
                await self.ws.send(json.dumps(message))
            except ConnectionClosed:
                # A server that refuses a session (no capacity) says why and closes at once,
                # maybe before this send: its reason is still there to read.
                pass
            raw = await asyncio.wait_for(self.ws.recv(), timeout=self.cfg.timeout_s)
        except asyncio.CancelledError:
            # The caller gave up (the driver's own deadline): an answer may still come, and
            # nothing could tell it from the next request's, so the session is closed.
            ws, self.ws = self.ws, None
            if ws is not None:
                asyncio.get_running_loop().create_task(ws.close())
            raise
        except (asyncio.TimeoutError, TimeoutError):
            await self.close()
            raise OpenEnvError(f"OpenEnv server {self.server!r} gave no answer to {message['type']} "
                               f"within {self.cfg.timeout_s:g} s") from None
        except ConnectionClosed as exc:
            self.ws = None
            raise _Lost(f"the session closed: {exc}") from None
        try:
            reply = json.loads(raw)
        except (json.JSONDecodeError, TypeError):
            raise OpenEnvError(f"OpenEnv server {self.server!r} answered with something other than JSON") from None
        if not isinstance(reply, dict) or not isinstance(reply.get("data"), dict):
            raise OpenEnvError(f"OpenEnv server {self.server!r} answered {str(raw)[:200]!r}")
        if reply.get("type") == "error":
            data = reply["data"]
            text = f"{data.get('code', 'ERROR')}: {str(data.get('message', ''))[:2000]}"
            if data.get("code") == "VALIDATION_ERROR":
                errors = data.get("errors")
                raise _Rejected(text + (f" {json.dumps(errors, default=str)[:2000]}" if errors else ""))
            raise _Retryable(text)
        return reply["data"]

    async def close(self) -> None:
        ws, self.ws = self.ws, None
        if ws is None:
            return
        try:
            await asyncio.wait_for(ws.send(json.dumps({"type": "close"})), CLOSE_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - best effort: the close below ends the session anyway
            pass
        try:
            await asyncio.wait_for(ws.close(), CLOSE_TIMEOUT_S)
        except Exception:  # noqa: BLE001
            pass


# ----------------------------------------------------------------------------- episodes


class OpenEnvEpisode:
    """One trajectory's session on the server (see the module's docstring)."""

    def __init__(self, env: "OpenEnvEnvironment", example: Example, sample: int):
        self.env, self.cfg = env, env.cfg
        # An example of the server's own task carries its reset seed; one of the job's
        # reasoning_gym or dataset task is posed by its text, with a seed drawn from that text.
        payload = getattr(example, "payload", None) or {}
        own = isinstance(payload.get("seed"), int) and payload.get("openenv") == env.name
        self.seed = payload["seed"] if own else zlib.crc32(str(example.question).encode()) % SEED_RANGE
        self.extra = {} if own else {"question": str(example.question)}
        self.episode_id = f"{env.tag}:{self.seed}:{sample}"[:255]
        self.session = _Session(env.name, env.cfg)
        self.rewards: list[float] = []
        self.done = False

    async def start(self) -> list[Message]:
        data = await self.env.loop.run(self._start())
        self.done = bool(data.get("done"))
        text = observation_text(data.get("observation"), self.cfg.observation_field, self.cfg.max_observation_chars)
        return [{"role": "user", "content": text}]

    async def _start(self) -> dict[str, Any]:
        self.env.sessions.add(self.session)
        payload = {"type": "reset", "data": {**self.env.reset_args, **self.extra, "seed": self.seed,
                                                "episode_id": self.episode_id}}

        async def attempt() -> dict[str, Any]:
            await self.session.close()   # a fresh session for each try: a failed one holds nothing
            await self.session.connect()
            try:
                return await self.session.request(payload)
            except _Rejected as exc:
                raise OpenEnvError(f"OpenEnv server {self.env.name!r} rejected the reset: {exc}") from None
        return await self._retrying("reset", attempt)

    async def _retrying(self, what: str, attempt) -> dict[str, Any]:
        for i in range(self.cfg.retries + 1):
            try:
                return await attempt()
            except _Retryable as exc:
                last = exc
                if i < self.cfg.retries:
                    await asyncio.sleep(BACKOFF_S * 2**i)
        raise OpenEnvError(f"OpenEnv server {self.env.name!r} failed {what} "
                           f"{self.cfg.retries + 1} times; last: {last}")

    async def step(self, turn: AssistantTurn) -> EnvReply:
        if self.done:
            return EnvReply(done=True, reward=self.total())
        action = self._action(turn)
        if isinstance(action, str):   # the model's JSON did not parse: it reads why
            return EnvReply(messages=[{"role": "user", "content": action}], tool_errors=1)
        try:
            data = await self.env.loop.run(self._step(action))
        except _Rejected as exc:
            return EnvReply(messages=[{"role": "user", "content": f"error: the environment rejected the "
                                                                  f"action: {exc}"}], tool_errors=1)
        reward = _reward(data.get("reward"))
        if reward is not None:
            self.rewards.append(reward)
        self.done = bool(data.get("done"))
        text = observation_text(data.get("observation"), self.cfg.observation_field, self.cfg.max_observation_chars)
        return EnvReply(messages=[{"role": "user", "content": text}], done=self.done,
                        reward=self.total() if self.done else None,
                        info={"step_reward": reward} if reward is not None else {})

    async def _step(self, action: dict[str, Any]) -> dict[str, Any]:
        payload = {"type": "step", "data": action}

        async def attempt() -> dict[str, Any]:
            try:
                return await self.session.request(payload)
            except _Lost as exc:
                raise OpenEnvError(f"OpenEnv server {self.env.name!r} dropped the episode's session "
                                   f"({exc}); its state is gone") from None
        return await self._retrying("step", attempt)

    def _action(self, turn: AssistantTurn) -> dict[str, Any] | str:
        if self.cfg.action_format == "json":
            obj = _last_json_object(turn.text)
            if obj is None:
                return "error: write the action as a JSON object"
            return {**self.cfg.action_defaults, **obj}
        return {**self.cfg.action_defaults, self.env.action_field: turn.text}

    def total(self) -> float | None:
        if not self.rewards:
            return None
        return sum(self.rewards) if self.cfg.reward == "sum" else self.rewards[-1]

    async def finish(self, transcript: list[Message]) -> float | None:
        return self.total()

    async def close(self) -> None:
        if not self.env.closed:
            await self.env.loop.run(self._close())

    async def _close(self) -> None:
        # On the env's loop, as every change to `env.sessions` is (close_all iterates it there).
        await self.session.close()
        self.env.sessions.discard(self.session)


class OpenEnvEnvironment:
    """A listed OpenEnv server, checked once per job (`build`)."""

    tools = None   # the model's text is the action; no tool schemas for the chat template

    def __init__(self, name: str, cfg: ServerConfig, action_field: str, reset_args: dict[str, Any], tag: str):
        self.name, self.cfg, self.action_field = name, cfg, action_field
        self.reset_args, self.tag = reset_args, tag
        self.loop = LoopThread(f"openenv-{name}", CLOSE_TIMEOUT_S)
        self.sessions: set[_Session] = set()
        self.closed = False

    def episode(self, example: Any, sample: int) -> OpenEnvEpisode:
        return OpenEnvEpisode(self, example, sample)

    def close(self) -> None:
        async def close_all() -> None:
            await asyncio.gather(*(s.close() for s in list(self.sessions)), return_exceptions=True)
            self.sessions.clear()
        if self.closed:
            return
        self.closed = True
        try:
            self.loop.submit(close_all()).result(timeout=2 * CLOSE_TIMEOUT_S)
        finally:
            self.loop.stop()


def _probe(name: str, cfg: ServerConfig) -> dict[str, Any]:
    """/health (with retries: a server may still be starting), then /schema's action schema."""
    import httpx

    last = ""
    with httpx.Client(timeout=cfg.connect_timeout_s, headers=cfg.headers, trust_env=False) as client:
        for i in range(cfg.retries + 1):
            try:
                r = client.get(cfg.http_url("/health"))
                if r.status_code == 200:
                    break
                last = f"HTTP {r.status_code}"
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            if i < cfg.retries:
                time.sleep(BACKOFF_S * 2**i)
        else:
            raise OpenEnvError(f"OpenEnv server {name!r} ({SETTING}) does not answer /health: {last}")
        if cfg.action_field is not None or cfg.action_format == "json":
            return {}
        try:
            r = client.get(cfg.http_url("/schema"))
            return r.json().get("action") or {} if r.status_code == 200 else {}
        except (httpx.HTTPError, ValueError, AttributeError):
            return {}


def build(env_spec: Any, *, task: Any = None, settings: Any = None, tag: str = "job") -> OpenEnvEnvironment:
    """The environment of `task.env` (type openenv): the named server, answering and mapped."""
    name = _get(env_spec, "name")
    cfg = server_config(name, settings)
    reset_args = _reset_args(env_spec)
    schema = _probe(name, cfg)
    action_field = cfg.action_field
    if action_field is None and cfg.action_format == "text":
        action_field = _schema_text_field(schema)
        if action_field is None:
            fields = sorted(k for k in (schema.get("properties") or {}) if k != "metadata")
            raise OpenEnvError(f"OpenEnv server {name!r}: its action's fields are {fields or 'unknown'}, not "
                               f"one text field; set action_field (or action_format json) in {SETTING}")
    return OpenEnvEnvironment(name, cfg, action_field or "", reset_args, str(tag))
