"""A real uvicorn server in a thread, for tests that need real sockets (slow clients)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn


@contextmanager
def serve(app) -> Iterator[str]:
    """Run `app` on a free local port; yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                          lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def stalled_upload(base_url: str, key: str) -> socket.socket:
    """Open a multipart upload, send its headers and a first chunk, then stall (caller closes)."""
    host, port = base_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    head = (f"POST /v1/datasets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: multipart/form-data; boundary=B\r\nContent-Length: 100000\r\n\r\n"
            '--B\r\nContent-Disposition: form-data; name="file"; filename="d.jsonl"\r\n\r\n')
    sock.sendall(head.encode())
    return sock
