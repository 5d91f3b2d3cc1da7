"""Load and slow-client benchmark of the API (docs/hardening.md, "Load").

    python bench/load.py [--clients 100] [--rate 200] [--streams 10] [--attack 32] [--seconds 20]
                         [--client aiohttp|httpx] [--workers 2]

Starts uvicorn with 2 workers on a fresh PostgreSQL database (127.0.0.1:5432), a job that
"runs" (a thread plays the worker: claims it and writes one metric row every 0.5 s), then at
the same time:
- `--clients` dashboards, each with its own key of the job's tenant, polling
  `GET /v1/jobs/{id}/metrics?after_step=` open-loop so that together they offer `--rate`
  requests/s (a request is sent on schedule even if the previous one has not answered);
- `--streams` followers of `/metrics/stream`;
- a slow-client attack: another tenant opens `--attack` uploads that send
  their headers and then stall (4 keys, so the per-key cap alone does not stop them).
It prints and writes (bench/out/load.json) requests/s answered, p50/p99 latency, every
non-200 answer of the victims, the 1-minute load average before and after, and the CPU ms per
request spent by the server (uvicorn and its PostgreSQL backends) and by the generator itself. The load generator shares the machine's cores with the
server, as a real co-located client would not: the figures are an upper bound on latency.
"""
from __future__ import annotations

import argparse
import asyncio
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
import uuid
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
import psutil  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402

PG = "postgresql+psycopg://postgres@127.0.0.1:5432"
ATTACK_KEYS = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _setup(url: str, clients: int, streams: int) -> tuple[str, list[str], list[str]]:
    """Migrate, make the keys and a running job; returns (job id, victim keys, attack keys)."""
    from store import jobs, keys
    from store.db import session_scope
    from store.migrate import upgrade
    from trainer.spec import JobSpec

    upgrade(url)
    spec = JobSpec.model_validate({"name": "load", "task": {"reasoning_gym": {"name": "chain_sum"}}})
    with session_scope(url) as s:
        victims = [keys.create_key(s, "dashboards") for _ in range(clients + streams)]
        attackers = [keys.create_key(s, "attacker") for _ in range(ATTACK_KEYS)]
        tenant = keys.get_tenant(s, "dashboards")
        job, _ = jobs.create_job(s, tenant.id, spec.model_dump(mode="json"),
                                 total_steps=spec.total_steps, name="load")
        job_id = job.id
    with session_scope(url) as s:
        jobs.claim(s, job_id, "bench-worker", lease_seconds=3600)
    return job_id, victims, attackers


def _play_worker(url: str, job_id: str, stop: threading.Event) -> None:
    from store import jobs
    from store.db import session_scope

    step = 0
    while not stop.wait(0.5):
        with session_scope(url) as s:
            jobs.record_metrics(s, job_id, 1, step, {"loss": 1.0 / (step + 1), "reward_mean": 0.5})
        step += 1


def _stall_upload(port: int, key: str) -> tuple[socket.socket, str]:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall((f"POST /v1/datasets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                  "Content-Type: multipart/form-data; boundary=B\r\nContent-Length: 1000000\r\n\r\n"
                  '--B\r\nContent-Disposition: form-data; name="file"; filename="d.jsonl"\r\n\r\n'
                  ).encode())
    return sock, key


class _Http:
    """The load generator's HTTP client: aiohttp (default; far less CPU per request than
    httpx, which matters when the generator shares the server's 2 cores) or httpx."""

    def __init__(self, kind: str, base: str, connections: int) -> None:
        self.kind, self.base, self.connections = kind, base, connections

    async def __aenter__(self) -> "_Http":
        if self.kind == "aiohttp":
            import aiohttp

            self.client = aiohttp.ClientSession(
                self.base, connector=aiohttp.TCPConnector(limit=self.connections),
                timeout=aiohttp.ClientTimeout(total=None, sock_read=30))
        else:
            self.client = httpx.AsyncClient(
                base_url=self.base, timeout=30,
                limits=httpx.Limits(max_connections=self.connections))
        return self

    async def __aexit__(self, *exc) -> None:
        await (self.client.close() if self.kind == "aiohttp" else self.client.aclose())

    async def get(self, path: str, params: dict, headers: dict) -> tuple[int, str]:
        """(status, the body's first bytes when it is not a 200); raises on a lost connection."""
        if self.kind == "aiohttp":
            async with self.client.get(path, params=params, headers=headers) as resp:
                body = await resp.read()
                return resp.status, "" if resp.status == 200 else body[:120].decode(errors="replace")
        resp = await self.client.get(path, params=params, headers=headers)
        return resp.status_code, "" if resp.status_code == 200 else resp.text[:120]

    async def lines(self, path: str, headers: dict):
        """(status, an async iterator over the body's lines) of a streamed GET."""
        if self.kind == "aiohttp":
            async with self.client.get(path, headers=headers) as resp:
                async def it():
                    async for raw in resp.content:
                        yield raw.decode(errors="replace")
                yield resp.status, it()
            return
        async with self.client.stream("GET", path, headers=headers) as resp:
            yield resp.status_code, resp.aiter_lines()


async def _dashboard(client: _Http, job_id: str, key: str, interval: float,
                     end: float, lat: list[float], errors: list[str]) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    tasks = []

    async def one() -> None:
        start = time.perf_counter()
        try:
            status, text = await client.get(f"/v1/jobs/{job_id}/metrics", {"limit": 50}, headers)
            if status != 200:
                errors.append(f"{status} {text}")
        except Exception as exc:  # noqa: BLE001 - any lost request is an error of the victim
            errors.append(f"{type(exc).__name__}: {exc}")
        lat.append(time.perf_counter() - start)

    next_at = time.perf_counter() + interval * (hash(key) % 1000) / 1000  # spread the starts
    while next_at < end:
        await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        tasks.append(asyncio.create_task(one()))
        next_at += interval
    await asyncio.gather(*tasks)


async def _follower(client: _Http, job_id: str, key: str, end: float,
                    counts: list[int], errors: list[str]) -> None:
    events = 0
    try:
        async for status, lines in client.lines(f"/v1/jobs/{job_id}/metrics/stream",
                                                {"Authorization": f"Bearer {key}"}):
            if status != 200:
                errors.append(f"stream {status}")
                return
            async for line in lines:
                events += line.startswith("event: metric")
                if time.perf_counter() > end:
                    break
    except Exception as exc:  # noqa: BLE001
        errors.append(f"stream {type(exc).__name__}: {exc}")
    counts.append(events)


async def _run_load(base: str, job_id: str, victims: list[str], args) -> dict:
    async with _Http(args.client, base, args.clients * 4 + args.streams) as client:
        end = time.perf_counter() + args.seconds
        lat: list[float] = []
        errors: list[str] = []
        counts: list[int] = []
        interval = args.clients / args.rate
        t0 = time.perf_counter()
        await asyncio.gather(
            *(_dashboard(client, job_id, k, interval, end, lat, errors)
              for k in victims[:args.clients]),
            *(_follower(client, job_id, k, end, counts, errors)
              for k in victims[args.clients:]))
        took = time.perf_counter() - t0
    lat.sort()
    return {
        "offered_rps": args.rate, "answered_rps": round(len(lat) / took, 1),
        "requests": len(lat), "p50_ms": round(1000 * statistics.median(lat), 1),
        "p99_ms": round(1000 * lat[int(0.99 * (len(lat) - 1))], 1),
        "max_ms": round(1000 * lat[-1], 1),
        "victim_errors": len(errors), "error_samples": sorted(set(errors))[:10],
        "stream_metric_events": counts,
    }


def _cpu_seconds(procs: list[psutil.Process]) -> dict[int, float]:
    """CPU seconds (user + system) of each process still alive, by pid."""
    out: dict[int, float] = {}
    for proc in procs:
        try:
            times = proc.cpu_times()
            out[proc.pid] = times.user + times.system
        except psutil.Error:  # it exited: its share is left out at both ends
            pass
    return out


def _cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(after[pid] - before[pid] for pid in after if pid in before)


def _server_procs(server: subprocess.Popen,
                  url: str) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """(uvicorn's processes, the PostgreSQL backends serving this database)."""
    procs = [psutil.Process(server.pid), *psutil.Process(server.pid).children(recursive=True)]
    backends: list[psutil.Process] = []
    name = url.rsplit("/", 1)[1]
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        pids = conn.execute(text("SELECT pid FROM pg_stat_activity WHERE datname = :n "
                                 "AND pid <> pg_backend_pid()"), {"n": name}).scalars().all()
    admin.dispose()
    for pid in pids:
        try:
            backends.append(psutil.Process(pid))
        except psutil.Error:
            pass
    return procs, backends


@contextmanager
def scratch_database(prefix: str):
    """A PostgreSQL database of one bench run's own, dropped afterwards (also on errors)."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(f"{PG}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield f"{PG}/{name}"
    finally:
        from store.db import reset_engine_cache

        reset_engine_cache()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--streams", type=int, default=10)
    ap.add_argument("--attack", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--client", choices=["aiohttp", "httpx"], default="aiohttp")
    args = ap.parse_args()

    with scratch_database("brorl_load") as url:
        stop = threading.Event()
        server = None
        try:
            job_id, victims, attackers = _setup(url, args.clients, args.streams)
            tmp = Path(tempfile.mkdtemp(prefix="brorl-load-"))
            port = _free_port()
            env = {**os.environ, "BRORL_DATABASE_URL": url, "BRORL_DATA_DIR": str(tmp),
                   "BRORL_BROKER_URL": f"sqla+sqlite:///{tmp / 'broker.db'}",
                   "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
            server = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "api.app:create_app", "--factory", "--port",
                 str(port), "--workers", str(args.workers), "--log-level", "warning"], env=env,
                start_new_session=True)  # its own process group: cleanup reaches the workers too
            base = f"http://127.0.0.1:{port}"
            for _ in range(300):
                try:
                    if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            writer = threading.Thread(target=_play_worker, args=(url, job_id, stop), daemon=True)
            writer.start()
            attack = [_stall_upload(port, attackers[i % ATTACK_KEYS]) for i in range(args.attack)]
            # Warm up (pools, prepared statements, the auth cache) so the run measures steady state.
            for key in victims[:args.clients]:
                httpx.get(f"{base}/v1/jobs/{job_id}/metrics", params={"limit": 50},
                          headers={"Authorization": f"Bearer {key}"}, timeout=30)
            me = psutil.Process()
            load_before = os.getloadavg()[0]
            api_procs, pg_procs = _server_procs(server, url)
            cpu0 = [_cpu_seconds(api_procs), _cpu_seconds(pg_procs), _cpu_seconds([me])]
            result = asyncio.run(_run_load(base, job_id, victims, args))
            api_cpu, pg_cpu, gen_cpu = (_cpu_delta(before, after) for after, before in zip(
                [_cpu_seconds(api_procs), _cpu_seconds(pg_procs), _cpu_seconds([me])], cpu0))
            server_cpu = api_cpu + pg_cpu
            per = 1000 / max(1, result["requests"])
            result.update(
                load_avg_1min=[round(load_before, 2), round(os.getloadavg()[0], 2)],
                client=args.client,
                # CPU ms per answered dashboard request (streams and the writer included): what
                # the server side (uvicorn + its PostgreSQL backends) and the generator each cost.
                server_cpu_ms_per_request=round(server_cpu * per, 2),
                api_cpu_ms_per_request=round(api_cpu * per, 2),
                postgres_cpu_ms_per_request=round(pg_cpu * per, 2),
                generator_cpu_ms_per_request=round(gen_cpu * per, 2))
            refused = 0
            for sock, _ in attack:  # how the stalled uploads ended (429 cap, 408 timeout, or open)
                sock.settimeout(0.01)
                try:
                    refused += sock.recv(64).startswith(b"HTTP/1.1 4")
                except OSError:
                    pass
                sock.close()
            result.update(clients=args.clients, streams=args.streams, api_workers=args.workers,
                          attack_connections=args.attack, attack_refused_4xx=refused,
                          seconds=args.seconds, cpus=os.cpu_count())
        finally:
            stop.set()
            if server is not None:
                os.killpg(server.pid, signal.SIGTERM)
                try:
                    server.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(server.pid, signal.SIGKILL)
                    server.wait(15)
    out = REPO / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "load.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
