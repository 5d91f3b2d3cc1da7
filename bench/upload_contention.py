"""What one tenant's parallel uploads cost another tenant's requests, with and without the cap.

    python bench/upload_contention.py [--uploaders 8] [--mb 28] [--seconds 15]

Starts uvicorn (one process, as `brorl up` does) on a fresh SQLite data dir, then runs three
scenarios one after the other:
- `baseline`: no uploads;
- `no cap`: `--uploaders` threads of one tenant upload `--mb` MB JSONL files back to back
  (`BRORL_MAX_CONCURRENT_UPLOADS_PER_TENANT` set far above them);
- `cap 2`: the same, with the default cap of 2 uploads in progress per tenant (the others
  are refused with a 429 and retried after its `Retry-After`).
`--repeat R` runs the two upload scenarios R times, alternating, since a shared machine's
load drifts during a run.
Each file's last line is invalid, so every upload is received, hashed, written and validated
in full and then refused (422): the whole cost of the path, and no disk filling up. Meanwhile
another tenant sends `GET /v1/jobs` every 50 ms; its p50 / p99 / max latency, the uploads
finished and the upload MB/s per scenario are printed and written to
bench/out/upload_contention.json. The client threads share the machine's cores with the
server: on a busy 2-core machine the figures are pessimistic.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

OUT = REPO / "bench" / "out" / "upload_contention.json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _payload(mb: int) -> bytes:
    line = json.dumps({"prompt": "What is 12345 + 67890? " + "x" * 60, "answer": "80235"}) + "\n"
    count = mb * 1024 * 1024 // len(line)
    return (line * count).encode() + b"not json\n"


def _keys(env: dict) -> tuple[str, str]:
    from store import keys
    from store.db import session_scope
    from store.migrate import upgrade

    upgrade(env["BRORL_DATABASE_URL"])
    with session_scope(env["BRORL_DATABASE_URL"]) as s:
        return keys.create_key(s, "uploader"), keys.create_key(s, "bystander")


def _server(env: dict, port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "api.app:create_app", "--factory", "--host",
         "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        cwd=REPO, env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.3)


def _uploader(url: str, key: str, body: bytes, stop: threading.Event, stats: dict) -> None:
    with httpx.Client(timeout=120) as client:
        while not stop.is_set():
            resp = client.post(f"{url}/v1/datasets", headers={"Authorization": f"Bearer {key}"},
                               files={"file": ("big.jsonl", body, "application/jsonl")})
            code = resp.status_code
            stats[code] = stats.get(code, 0) + 1
            if code == 429:  # retried after its Retry-After (a client ignoring it meets the
                time.sleep(float(resp.headers.get("Retry-After", "1")))  # per-key rate limit)


def _victim(url: str, key: str, seconds: float) -> list[float]:
    latencies = []
    with httpx.Client(timeout=60) as client:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            start = time.monotonic()
            resp = client.get(f"{url}/v1/jobs", headers={"Authorization": f"Bearer {key}"})
            latencies.append(time.monotonic() - start)
            assert resp.status_code == 200, resp.text
            time.sleep(max(0.0, 0.05 - (time.monotonic() - start)))
    return latencies


def scenario(name: str, cap: int, uploaders: int, mb: int, seconds: float) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="brorl-upload-bench-"))
    port = _free_port()
    env = {**os.environ, "BRORL_DATA_DIR": str(folder), "PYTHONPATH": str(REPO),
           "BRORL_DATABASE_URL": f"sqlite:///{folder / 'brorl.db'}",
           "BRORL_MAX_UPLOAD_BYTES": str((mb + 8) * 1024 * 1024),
           "BRORL_MAX_CONCURRENT_UPLOADS_PER_TENANT": str(cap),
           "BRORL_MAX_CONCURRENT_PER_KEY": "64"}
    uploader_key, victim_key = _keys(env)
    proc = _server(env, port)
    url = f"http://127.0.0.1:{port}"
    stop, stats, threads = threading.Event(), {}, []
    body = _payload(mb)
    try:
        for _ in range(uploaders):
            t = threading.Thread(target=_uploader, args=(url, uploader_key, body, stop, stats),
                                 daemon=True)
            t.start()
            threads.append(t)
        time.sleep(1.0 if uploaders else 0)  # let the uploads get going
        lat = sorted(_victim(url, victim_key, seconds))
    finally:
        stop.set()
        for t in threads:
            t.join(120)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    full = stats.get(422, 0)
    return {"scenario": name, "uploaders": uploaders, "mb": mb, "cap": cap,
            "victim_requests": len(lat), "p50_ms": round(1000 * statistics.median(lat), 1),
            "p99_ms": round(1000 * lat[int(0.99 * (len(lat) - 1))], 1),
            "max_ms": round(1000 * lat[-1], 1), "uploads_completed": full,
            "uploads_refused_429": stats.get(429, 0),
            "upload_mb_per_s": round(full * mb / (seconds + 1), 1),
            "load_avg_1m": round(os.getloadavg()[0], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--uploaders", type=int, default=8)
    parser.add_argument("--mb", type=int, default=28)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    runs = [scenario("baseline", 2, 0, args.mb, args.seconds)]
    for _ in range(args.repeat):
        runs.append(scenario("no cap", 1000, args.uploaders, args.mb, args.seconds))
        runs.append(scenario("cap 2", 2, args.uploaders, args.mb, args.seconds))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(runs, indent=2) + "\n")
    for run in runs:
        print(json.dumps(run))
    print(f"written to {OUT}")


if __name__ == "__main__":
    main()
