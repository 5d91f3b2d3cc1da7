"""The webhook dispatcher: a thread of each API process that sends the outbox's due rows.

Every `POLL_S` it claims up to `BATCH` due deliveries (store.webhooks.claim_due: a
compare-and-set, so several API processes share the work without sending a row twice at
once), posts each, signed by the Standard Webhooks scheme (`webhook-id`, `webhook-timestamp`,
`webhook-signature`: HMAC-SHA256 over "id.timestamp.body" with the endpoint's secret, and the
previous secret beside it during a rotation), through the guarded client (api.webhooks.guard),
and records the answer. Each call has a hard total deadline (`BRORL_WEBHOOK_TIMEOUT_S`, the
guard's `deadline`, not httpx's per-phase timeouts) and reads at most `MAX_ANSWER` bytes of
the answer: a receiver that trickles or floods its answer is a failed attempt, retried with
the backoff like any other, and cannot hold the thread past its claim. A row claimed by a process that dies is due again after the claim's
lease. Turned off per process with `BRORL_WEBHOOK_DISPATCH=false` (then another process, or
none, sends).
"""
from __future__ import annotations

import json
import logging
import threading
from datetime import datetime

import httpx
from sqlalchemy.orm import Session, sessionmaker
from standardwebhooks import Webhook

from store import webhooks
from store.settings import Settings
from store.tables import utcnow

from api.webhooks.guard import Forbidden, deadline, guarded_client, parse_networks

log = logging.getLogger(__name__)

POLL_S = 1.0
BATCH = 20
USER_AGENT = "brorl-webhooks/1"
MAX_ANSWER = 64 * 1024  # bytes of a receiver's answer read (a 2xx needs none; the raw bytes: no gzip bomb)


def signed_headers(message_id: str, secrets: list[str], body: bytes, now: datetime) -> dict[str, str]:
    signatures = " ".join(Webhook(secret).sign(message_id, now, body) for secret in secrets)
    return {"webhook-id": message_id, "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": signatures, "content-type": "application/json",
            "user-agent": USER_AGENT}


def send(client: httpx.Client, claimed: webhooks.Claimed, now: datetime,
         deadline_s: float) -> tuple[bool, int | None, str | None]:
    """(delivered, status code, error) of one attempt, over within `deadline_s` seconds."""
    body = json.dumps(claimed.payload, separators=(",", ":")).encode()
    code = None
    try:
        with deadline(deadline_s), client.stream("POST", claimed.url, content=body, headers=signed_headers(
                claimed.message_id, claimed.secrets, body, now)) as resp:
            code, read = resp.status_code, 0
            for chunk in resp.iter_raw():
                read += len(chunk)
                if read > MAX_ANSWER:
                    return False, code, f"answer body over {MAX_ANSWER // 1024} KiB: not read further"
    except Forbidden as exc:
        return False, None, f"refused: {exc}"
    except httpx.TimeoutException:
        return False, code, f"timed out: no complete answer within the {deadline_s:g} s deadline"
    except httpx.HTTPError as exc:
        return False, code, f"{type(exc).__name__}: {exc}"
    ok = 200 <= code < 300
    return ok, code, None if ok else f"HTTP {code}"


def dispatch_once(sessions: sessionmaker[Session], client: httpx.Client, lease_s: float,
                  deadline_s: float) -> int:
    """Claim, send and record one batch; returns how many were attempted. A claim's lease
    outlasts the batch: each call ends by `deadline_s`."""
    with sessions() as s:
        batch = webhooks.claim_due(s, BATCH, lease_s)
        s.commit()
    for claimed in batch:
        now = utcnow()
        ok, code, error = send(client, claimed, now, deadline_s)
        with sessions() as s:
            webhooks.record_attempt(s, claimed.id, ok=ok, status_code=code, error=error)
            s.commit()
        if not ok:
            log.info("webhook %s to %s: %s", claimed.message_id, claimed.url, error)
    return len(batch)


class Dispatcher(threading.Thread):
    """The API process's dispatcher thread (started and stopped by the app's lifespan)."""

    def __init__(self, settings: Settings, sessions: sessionmaker[Session]) -> None:
        super().__init__(name="webhook-dispatcher", daemon=True)
        self.sessions = sessions
        self.timeout_s = settings.webhook_timeout_s
        self.allowed = parse_networks(settings.webhook_allowed_networks)
        self._stopping = threading.Event()

    def run(self) -> None:
        # A claim outlives the slowest batch: every call may take its whole deadline, no more.
        lease_s = BATCH * self.timeout_s + 30
        with guarded_client(self.allowed, self.timeout_s) as client:
            while not self._stopping.is_set():
                try:
                    busy = dispatch_once(self.sessions, client, lease_s, self.timeout_s)
                except Exception:  # the database away for a moment: try again next tick
                    log.exception("webhook dispatch failed; retrying")
                    busy = 0
                if not busy:
                    self._stopping.wait(POLL_S)

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        self.join(timeout)
