"""The environment variables the graders read, in one place (the operator's business).

Sandbox limits (OpenAI's: 2 GB of memory, which is 4 GB of address space here; 2 minutes a
call), the unsafe override for machines with no isolation layer, the LLM judges a tenant may
name (and the model ids, such as OpenAI's, that stand for them), and where WordNet lives.
Read fresh on each call, so a test or a worker can change them between runs; a bad value is
a ValueError naming its variable.
"""
from __future__ import annotations

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

PREFIX = "BRORL_"


class GraderSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="ignore")

    # Address space, not resident memory: OpenAI's grader image's packages imported together
    # (numpy .. scikit-bio, rdkit) reserve 2.2 GB of it for 0.5 GB resident, so OpenAI's "2 GB
    # of memory" needs about 4 GB of RLIMIT_AS here.
    grader_memory_mb: int = Field(4096, ge=64, description="address space of a sandbox")
    grader_tmp_mb: int = Field(256, ge=1, description="size of a sandbox's private /tmp")
    grader_output_kb: int = Field(1024, ge=1, description="what one program may print")
    grader_timeout_s: float = Field(120.0, gt=0, description="wall time per graded sample")
    grader_api_concurrency: int = Field(4, ge=1, le=256, description="sandboxes the API "
                                        "runs at once for /graders/run (each call gets its own)")
    sandbox_uid_base: int = Field(2_000_000_000, ge=1, le=4_294_901_758, description=(
        "first of the 65,536 uids a root service runs sandboxes as (one per sandbox)"))
    bwrap_path: str = Field("", description="bubblewrap's binary (default: found on PATH, "
                                            "/usr/local/bin, /usr/bin, /bin)")
    unsafe_graders: bool = Field(False, description="run graders with no isolation layer")
    judges: str = Field("", description='JSON {"name": {"base_url", "model", ...}} of judges')
    judge_aliases: str = Field("", description='JSON {"model id": "judge name"}: model ids '
                                               'graders may name (OpenAI\'s) for a judge')
    wordnet_dir: str = Field("", description="WordNet 3.0 database folder for meteor")


def grader_settings() -> GraderSettings:
    try:
        return GraderSettings()
    except ValidationError as exc:
        err = exc.errors()[0]
        name = PREFIX + str(err["loc"][0]).upper()
        raise ValueError(f"{name}={err.get('input')!r}: {err['msg']}") from None
