"""Service settings: one pydantic-settings object read from `BRORL_*` environment variables.

Everything that differs between the embedded default (SQLite files in a data dir) and a
production deployment (Postgres, Redis, a shared artifact volume) is a field here, so the
API, the worker, the CLI and Alembic all agree on where things live.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

MIB = 1024 * 1024
DEFAULT_DATA_DIR = Path("~/.brorl")


def _named(field: str, *former: str) -> AliasChoices:
    """A field read from its BRORL_ variable, a former name's, or its own name when passed in."""
    return AliasChoices(field, *(f"BRORL_{n.upper()}" for n in (field, *former)))


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Settings(BaseSettings):
    """Runtime configuration; fields left unset derive from `data_dir`."""

    model_config = SettingsConfigDict(env_prefix="BRORL_", extra="ignore")

    data_dir: Path = DEFAULT_DATA_DIR
    # The next three default to files under data_dir; _derive_defaults fills them in when they
    # are not given (unset or empty), so that setting BRORL_DATA_DIR alone moves everything.
    database_url: str = ""
    broker_url: str = ""
    artifact_dir: Path = Path()
    max_upload_bytes: int = 100 * MIB
    # A worker holds a job for lease_seconds and renews it every heartbeat_seconds; the reaper
    # requeues (or fails) running jobs whose lease ran out, which is how crashed workers are
    # recovered.
    lease_seconds: int = 120
    heartbeat_seconds: float = 20
    # While the database is unreachable the worker keeps up to this many metric/event rows in
    # memory (written in order once it is back); one more fails the attempt.
    sink_buffer_rows: int = Field(10_000, ge=1)
    # The rollouts a job stores for reading (`samples.per_step`) stop at this many bytes of
    # text per job; its metrics go on. 64 samples x 2 x 4,000 chars a step fill it in ~100 steps
    # at the spec's limits, 8 short ones a step in thousands. A multi-turn sample's transcript
    # counts too (its JSON; at most 200,000 characters a sample: store/sample_rows.py).
    max_sample_bytes_per_job: int = Field(50 * MIB, ge=0)
    reaper_interval_seconds: float = 30
    # A queued job nobody claimed for this long is enqueued again by the reaper: this recovers
    # an enqueue that failed after the commit (broker down) or a message the broker lost. A
    # duplicate message is harmless (the claim is a compare-and-set), so the cost of a long
    # backlog is one extra no-op message per job per period.
    requeue_queued_after_seconds: float = 900
    # Deliberately far larger than the lease: with acks_late a message of a long job is
    # unacknowledged for the whole run, and if the broker redelivered it while the job still
    # held a live lease a second worker would see it. The claim CAS would refuse that copy,
    # but redelivery is not the recovery path anyway: the lease + reaper is. So the broker
    # only redelivers after a time no live lease could still be running unnoticed.
    broker_visibility_timeout: int = 7200
    # Dotted "module:function" the worker calls as train(spec, sink, should_stop, resume);
    # tests point it at a double.
    trainer_entrypoint: str = "trainer:train"
    # The GPU counts this deployment's workers serve, e.g. "1,2" (env: a comma list): a job
    # asking for another `resources.gpus_per_node` is a 422, since no worker would take it.
    # Each count has its own queue (worker.celery_app.queue_for); `brorl up` serves them all.
    # NoDecode: the env value is the comma list itself, not JSON.
    gpu_counts: Annotated[tuple[int, ...], NoDecode] = (1,)
    # Multi-node jobs (resources.nodes > 1) run their ranks on the Ray cluster at ray_address
    # (trainer.distributed.ray_launcher; the workers read the same variable). The API accepts
    # them only where it is set, up to ray_max_nodes nodes of at most ray_gpus_per_node GPUs
    # (the cluster's node shape; 0: not checked); elsewhere they are a 422 naming these.
    ray_address: str = ""
    ray_max_nodes: int = Field(0, ge=0)
    ray_gpus_per_node: int = Field(0, ge=0)
    # Memory of one worker device (GiB) that a job's estimate checks its spec against
    # (api/estimate_model.py); 0: unknown, the fit is not checked.
    worker_memory_gb: float = Field(0, ge=0)

    # --- API hardening (api/guards.py, api/ratelimit.py, api/quotas.py; docs/hardening.md).
    # A JSON body (a job spec) larger than this is a 413 before it is parsed.
    max_json_bytes: int = 256 * 1024
    # A request body that sends nothing for body_idle_timeout_s, or has not finished after
    # body_timeout_s, is a 408; a response the client does not read for send_idle_timeout_s
    # is dropped. Slow clients then cannot pin a worker's connections for ever.
    body_idle_timeout_s: float = 30
    body_timeout_s: float = 600
    send_idle_timeout_s: float = 60
    # Per API key, per API process: requests in flight (streams not counted) and open streams.
    max_concurrent_per_key: int = 8
    max_streams_per_key: int = 5
    # Requests in flight without an API key (health checks, /docs, the dashboard's files), per address.
    max_concurrent_per_address: int = 32
    # Token bucket per API key, per API process; 0 turns rate limiting off.
    rate_limit_per_s: float = 20
    rate_limit_burst: int = 40
    # Per client address, per API process, for requests without a key (the health checks, /docs, the
    # dashboard's files) and for failed authentications (each 401 takes a token; an address
    # out of them gets 429s until they refill). 0 turns either off.
    anon_rate_limit_per_s: float = 20
    anon_rate_limit_burst: int = 100
    auth_failures_per_s: float = 1
    auth_failures_burst: int = 20
    # Per tenant, checked in the database when a job or dataset is created.
    max_active_jobs_per_tenant: int = 20
    max_datasets_per_tenant: int = 100
    max_dataset_bytes_per_tenant: int = 10 * 1024 * MIB
    max_dataset_line_bytes: int = 1 * MIB
    max_streams_per_tenant: int = 20  # open metric streams, per API process
    # Uploads in progress per tenant, per API process: parsing, hashing and validating one
    # costs CPU on the cores every tenant shares (docs/hardening.md, "Uploads").
    max_concurrent_uploads_per_tenant: int = 2
    # `model.path` may be builtin:tiny, a folder under one of these roots (os.pathsep-separated),
    # or, only when allow_hub_models is true, a hub id. Workers run hub-offline otherwise.
    model_roots: str = ""
    allow_hub_models: bool = False
    # A key found valid is trusted for this long without asking the database again (one
    # query less per request); a revoked key therefore stops working within this time.
    auth_cache_seconds: float = 5
    # Before a job is accepted its reasoning-gym config builds a few examples in a child
    # process with these limits (api/task_check.py); 0 s turns the check off. Per API process,
    # at most max_concurrent_task_checks such children run at once.
    # The BRORL_*TASK_PROBE* names of earlier releases are still read.
    task_check_timeout_s: float = Field(10, ge=0, validation_alias=_named(
        "task_check_timeout_s", "task_probe_timeout_s"))
    task_check_memory_mb: int = Field(1024, ge=64, validation_alias=_named(
        "task_check_memory_mb", "task_probe_memory_mb"))
    max_concurrent_task_checks: int = Field(2, ge=1, validation_alias=_named(
        "max_concurrent_task_checks", "max_concurrent_task_probes"))
    # Webhooks (api/webhooks): endpoints per tenant; networks a webhook may reach although
    # they are not public (comma-separated CIDRs; by default none: loopback, private and
    # link-local addresses are refused); each call's time limit; whether this API process
    # sends the outbox (any number of processes may).
    webhook_max_endpoints: int = Field(10, ge=0, le=1000)
    webhook_allowed_networks: str = ""
    webhook_timeout_s: float = Field(10, gt=0, le=60)
    webhook_dispatch: bool = True
    # Host headers the API answers (comma-separated, `*.example.com` allowed); others are a
    # 400. The default `*` answers any: set it in production (api/headers.py).
    allowed_hosts: Annotated[list[str], NoDecode] = ["*"]
    # `/metrics` shows per-status job counts only to `Authorization: Bearer <metrics_token>`.
    metrics_token: str = ""
    # Talking to checkpoints (docs/inference.md): the API proxies /v1/chat/completions and
    # /v1/completions to the workers' inference servers.
    inference_urls: str = ""  # comma-separated; empty: the local one at inference_host:port
    inference_host: str = "127.0.0.1"
    inference_port: int = Field(8090, ge=1, le=65535)
    inference_token: str = ""  # empty: a random one kept in {artifact_dir}/inference.token
    inference_backend: str = "auto"  # auto: vllm with a GPU and vLLM, else hf
    inference_cache_models: int = Field(2, ge=1)
    inference_cache_bytes: int = Field(8 * 1024 * MIB, ge=1)
    inference_max_tokens: int = Field(1024, ge=1)
    inference_max_n: int = Field(4, ge=1)
    inference_timeout_s: float = Field(300, gt=0)
    max_generations_per_tenant: int = Field(2, ge=1)  # concurrent, per API process
    # Prompt + completion tokens a tenant's completions may use per rolling 24 hours, counted
    # in the database (every API process alike); 0: unlimited.
    completion_tokens_per_day: int = Field(0, ge=0)
    worker_id: str = Field(default_factory=_default_worker_id)

    @model_validator(mode="before")
    @classmethod
    def _derive_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        data_dir = Path(data.get("data_dir") or DEFAULT_DATA_DIR).expanduser()
        data["data_dir"] = data_dir
        if not data.get("database_url"):
            data["database_url"] = f"sqlite:///{data_dir / 'brorl.db'}"
        if not data.get("broker_url"):
            data["broker_url"] = f"sqla+sqlite:///{data_dir / 'broker.db'}"
        artifact_dir = data.get("artifact_dir")
        data["artifact_dir"] = (
            Path(artifact_dir).expanduser() if artifact_dir else data_dir / "artifacts"
        )
        return data

    @field_validator("webhook_allowed_networks")
    @classmethod
    def _check_networks(cls, value: str) -> str:
        for part in filter(None, (p.strip() for p in value.split(","))):
            ipaddress.ip_network(part, strict=False)  # ValueError names the bad one
        return value

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _parse_hosts(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [h.strip() for h in value.split(",") if h.strip()]
        return list(value) or ["*"]

    @field_validator("gpu_counts", mode="before")
    @classmethod
    def _parse_gpu_counts(cls, value: Any) -> Any:
        if isinstance(value, str):
            items = value.split(",")
        else:
            items = [value] if isinstance(value, int) else list(value)
        counts = []
        for item in items:
            text = str(item).strip()
            if not text.isdigit() or int(text) < 1:
                raise ValueError(f"BRORL_GPU_COUNTS must list positive whole numbers like "
                                 f"'1,2'; got {value!r}")
            counts.append(int(text))
        if not counts:
            raise ValueError("BRORL_GPU_COUNTS lists no GPU count; the default is '1'")
        return tuple(sorted(set(counts)))

    def model_root_paths(self) -> list[Path]:
        return [Path(p).expanduser() for p in self.model_roots.split(os.pathsep) if p.strip()]

    def ensure_dirs(self) -> None:
        """Create the data and artifact folders (on demand, not at import time)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.artifact_dir.mkdir(parents=True, exist_ok=True)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings; the data dir exists once this returns."""
    settings = Settings()
    settings.ensure_dirs()
    return settings


def reset_settings_cache() -> None:
    """Forget the cached settings (tests change the environment between cases)."""
    get_settings.cache_clear()
