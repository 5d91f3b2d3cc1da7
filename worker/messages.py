"""What a tenant is told when their job fails: one line, with no server internals.

The `failed` event and the job's `error` are read by tenants, so they get the exception's
type and message with absolute paths replaced by `<path>` and no traceback; the operator
gets the full traceback in the worker's log (`Lease.fail` in worker.lease).
"""

from __future__ import annotations

import re

MAX_CHARS = 1000
# An absolute or home-relative path: "/" or "~/" not preceded by a word character ("1/2" and
# "km/h" stay), up to the next space, quote, bracket or colon.
_PATH = re.compile(r"(?<![\w.~])~?/[^\s'\"()\[\]{},;:]+")


def redact_paths(text: str) -> str:
    return _PATH.sub("<path>", text)


def user_message(exc: BaseException) -> str:
    """`Type: message` for a tenant: paths redacted, one line, at most MAX_CHARS."""
    if isinstance(exc, MemoryError):
        return "MemoryError: the worker ran out of memory; try smaller batches or a smaller model"
    text = " ".join(redact_paths(str(exc)).split())
    message = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return message if len(message) <= MAX_CHARS else message[: MAX_CHARS - 3] + "..."
