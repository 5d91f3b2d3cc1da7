# syntax=docker/dockerfile:1
# One Dockerfile, two targets (`docker build --target api|worker .`; docker-compose.yml picks
# them):
#   api     - the control plane: the base package only (FastAPI, SQLAlchemy, Celery client).
#             It never imports torch or vLLM, so it does not carry them (a much smaller image);
#             the compose `migrate` and `reaper` services reuse it.
#   worker  - the GPU worker: the same package plus the `gpu` extra (vLLM, which brings its
#             CUDA build of torch). It needs the NVIDIA container toolkit on the host.
# The base stage installs the dependencies before copying the source, so code edits do not
# reinstall them. constraints.txt is not used here: it pins the CPU build of torch.
# bubblewrap and libseccomp2: the grader sandbox; wordnet-base: the meteor metric's WordNet;
# wordnet-sense-index and liblingua-stopwords-perl: nltk's wordnet and stopwords corpora for
# python graders (trainer/graders/corpora.py builds them under /usr/local/share/nltk_data).

FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    BRORL_DATA_DIR=/data \
    BRORL_ARTIFACT_DIR=/artifacts
RUN apt-get update \
 && apt-get install -y --no-install-recommends curl bubblewrap libseccomp2 wordnet-base \
    wordnet-sense-index liblingua-stopwords-perl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 1000 brorl \
 && mkdir -p /data /artifacts /app \
 && chown brorl:brorl /data /artifacts /app
WORKDIR /app
# Only the metadata first: a layer with the dependencies that survives source edits.
COPY pyproject.toml README.md ./
RUN mkdir -p api worker trainer store cli migrations \
 && touch api/__init__.py worker/__init__.py trainer/__init__.py store/__init__.py \
          cli/__init__.py migrations/__init__.py

FROM base AS api
# The graders extra: /v1/graders/run runs python graders here too.
RUN pip install ".[graders]" && pip uninstall -y brorl
COPY . .
RUN pip install --no-deps . && python -m trainer.graders.corpora
USER brorl
EXPOSE 8000
CMD ["uvicorn", "api.app:create_app", "--factory", "--host", "0.0.0.0", "--port", "8000"]

FROM base AS worker
RUN pip install ".[gpu,ray]" && pip uninstall -y brorl
COPY . .
RUN pip install --no-deps . && python -m trainer.graders.corpora
USER brorl
# Queue gpu, one job at a time; prefork with a fresh child per job (see cli/server.py).
CMD ["brorl", "worker", "--queues", "gpu", "--pool", "prefork", "--concurrency", "1"]
