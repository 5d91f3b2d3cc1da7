"""What the API and the workers' inference servers share: where the servers are, and the
token the API shows them (docs/inference.md).

The token keeps anyone but the API from asking a worker to load a folder: the API has already
checked the tenant and resolved the checkpoint; the server trusts what a token holder names
(within the artifact dir). Unset, it is a random one kept in the artifact dir: every process
that serves checkpoints already shares that folder (`brorl up`'s, compose's api and workers), and
no tenant's download reaches the file. BRORL_INFERENCE_TOKEN overrides it everywhere.
"""
from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

from store.settings import Settings

TOKEN_FILE = "inference.token"


def inference_token(settings: Settings) -> str:
    if settings.inference_token:
        return settings.inference_token
    path = Path(settings.artifact_dir) / TOKEN_FILE
    if not path.exists():
        settings.ensure_dirs()
        fresh = secrets.token_urlsafe(32)
        try:  # O_EXCL: two processes starting together keep the first one's token
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(fresh)
        except FileExistsError:
            pass
    return path.read_text().strip()


def inference_urls(settings: Settings) -> list[str]:
    urls = [u.strip().rstrip("/") for u in settings.inference_urls.split(",") if u.strip()]
    return urls or [f"http://{settings.inference_host}:{settings.inference_port}"]


def server_for(settings: Settings, checkpoint_uri: str) -> str:
    """The server that serves a checkpoint: always the same one for the same checkpoint, so
    its model stays in that server's cache instead of being loaded on every server."""
    urls = inference_urls(settings)
    digest = int(hashlib.sha256(checkpoint_uri.encode()).hexdigest(), 16)
    return urls[digest % len(urls)]
