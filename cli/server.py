"""`brorl` commands that run the service: up, demo, worker, migrate, keys create|list|revoke.

`brorl up` is the embedded default: SQLite for the database and the Celery broker (files in
the data dir), the API (uvicorn) and one worker as child processes, no server to install. That
one worker serves the queue of every GPU count in BRORL_GPU_COUNTS: on one machine it runs a
G-GPU job itself (the trainer starts its G ranks), one job at a time. Where the deployment
serves multi-node jobs (BRORL_RAY_ADDRESS set) more workers serve their queue, `ray`: each
drives one job (lease, relay, cancel) while Ray runs its ranks on the cluster's nodes, so a
multi-node job waiting for its nodes never holds up the one-node jobs behind it.
Each child runs in its own session (process group) so that Ctrl-C reaches only `brorl up`,
which then stops both children itself: SIGTERM, a bounded wait, SIGKILL to the group (which
also takes the worker's embedded beat process).
"""
from __future__ import annotations

import faulthandler
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

console = Console()
REPO_ROOT = Path(__file__).resolve().parent.parent
DEMO_SPEC = REPO_ROOT / "examples" / "demo.yaml"
LOCAL_TENANT = "local"


# --------------------------------------------------------------------------- helpers


UP_LIMIT_CONCURRENCY = 1000  # uvicorn's cap on connections + requests at once (then 503s)


def _use_data_dir(data_dir: Path | None) -> None:
    """Point this process and its children at `data_dir` (absolute, so cwd doesn't matter)."""
    if data_dir is not None:
        os.environ["BRORL_DATA_DIR"] = str(data_dir.expanduser().resolve())
    from store.settings import reset_settings_cache

    reset_settings_cache()


def dashboard_url(base_url: str, key: str, path: str = "/") -> str:
    """A dashboard link that logs the browser in once: the key rides in the URL fragment,
    which browsers never send to the server; the page moves it to sessionStorage and removes
    it from the address bar."""
    return f"{base_url.rstrip('/')}{path}#key={key}"


def ensure_local_key(data_dir: Path) -> tuple[str, bool]:
    """The local tenant's key from `<data_dir>/local.key`, created (0600) on first start.

    A key file whose key the database no longer knows (the database was deleted) is replaced.
    Returns (key, created).
    """
    from store import keys
    from store.db import session_scope

    path = data_dir / "local.key"
    if path.is_file():
        key = path.read_text().strip()
        with session_scope() as s:
            if keys.authenticate(s, key) is not None:
                return key, False
    with session_scope() as s:
        key = keys.create_key(s, LOCAL_TENANT)
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key + "\n")
    os.replace(tmp, path)
    return key, True


def worker_queues(queues: str | None, gpus: int | None) -> str:
    """The queues `brorl worker` serves: `--queues` as given plus the queue of `--gpus G`
    (`gpu`, the 1-GPU queue, when neither is given)."""
    from worker.celery_app import queue_for

    names = [q for q in (queues or "").split(",") if q]
    if gpus is not None:
        names.append(queue_for(gpus))
    return ",".join(dict.fromkeys(names)) or queue_for(1)


def up_worker_command(settings) -> list[str]:
    """`brorl up`'s worker: the reaper's beat, and the queue of every served GPU count (the
    API accepts exactly those counts, so no job it accepts waits on a queue nobody serves)."""
    from worker.celery_app import queue_for

    queues = ",".join(queue_for(g) for g in settings.gpu_counts)
    return [sys.executable, "-m", "cli.main", "worker", "--beat", "--queues", queues]


# Multi-node jobs `brorl up` drives at once, one per worker process: one can wait for Ray to
# place its nodes while another runs. More wait in the `ray` queue, holding nothing.
RAY_DRIVERS = 2


def up_ray_driver_commands(settings) -> list[list[str]]:
    """`brorl up`'s workers for multi-node jobs (queue `ray`), where the deployment names a Ray
    cluster (BRORL_RAY_ADDRESS; the API refuses `resources.nodes > 1` otherwise); none where it
    does not. RAY_DRIVERS processes of the solo pool, each driving one job in its main process
    (a driver holds no GPU, so it needs no fresh child per job; a worker's warm shutdown then
    reaches the job it drives, worker.entrypoints._stop_running_job)."""
    if not settings.ray_address:
        return []
    from worker.celery_app import RAY_QUEUE

    return [[sys.executable, "-m", "cli.main", "worker", "--queues", RAY_QUEUE, "--pool", "solo"]
            for _ in range(RAY_DRIVERS)]


def declare_queues(settings, commands: list[list[str]]) -> list[str]:
    """Create in the broker every queue that `commands` (`brorl worker` command lines) serve,
    before they start; returns the names. Kombu's SQLAlchemy transport (the SQLite broker)
    creates a queue's row on first use and guards that within one process only: two workers
    starting on one queue at once (the Ray drivers) both insert it, and the loser dies of the
    UNIQUE constraint."""
    from worker.celery_app import MAINTENANCE_QUEUE, make_app

    names = [MAINTENANCE_QUEUE] if any("--beat" in c for c in commands) else []
    for command in commands:
        names += command[command.index("--queues") + 1].split(",")
    names = list(dict.fromkeys(n for n in names if n))
    with make_app(settings).connection_for_write() as conn:
        for name in names:
            conn.default_channel.queue_declare(queue=name)
    return names


def worker_argv(queues: str, beat: bool, pool: str, concurrency: int, loglevel: str) -> list[str]:
    """`celery worker` arguments; `beat` also serves the reaper's maintenance queue."""
    from worker.celery_app import MAINTENANCE_QUEUE

    names = [q for q in queues.split(",") if q]
    if beat and MAINTENANCE_QUEUE not in names:
        names.append(MAINTENANCE_QUEUE)
    argv = ["worker", "-Q", ",".join(names), "-c", str(concurrency), "--pool", pool,
            "--loglevel", loglevel, "--without-gossip", "--without-mingle"]
    if pool == "prefork":
        # A fresh child per job: GPU memory and global state from the last job are released.
        argv += ["--max-tasks-per-child", "1"]
    if beat:
        argv.append("-B")
    return argv


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to SIGTERM it when `brorl up` dies, even by
    SIGKILL, so the worker never lives on as an orphan holding a job's lease."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _spawn(argv: list[str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen(argv, start_new_session=True, preexec_fn=_die_with_parent, **kwargs)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_or_kill(proc: subprocess.Popen, timeout: float) -> None:
    """Wait up to `timeout` for the child, then SIGKILL its whole group."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    # Also takes grandchildren (the worker's embedded beat) a dying child left behind.
    _signal_group(proc, signal.SIGKILL)
    proc.wait(timeout=10)


def stop_process(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM the child's group, wait up to `timeout`, then SIGKILL the group."""
    if proc.poll() is None:
        _signal_group(proc, signal.SIGTERM)
    wait_or_kill(proc, timeout)


def supervise(procs: dict[str, subprocess.Popen], stop_timeout: float) -> int:
    """Wait until Ctrl-C / SIGTERM or a child exits, then stop every child; exit code.

    The signals only set a flag that the loop reads: a KeyboardInterrupt raised at an arbitrary
    point could land inside `Popen.poll` while it holds the Popen's wait lock, and every later
    wait on that child would then time out instead of reaping it.
    """
    stop = {"signal": None}

    def request_stop(signum, frame):
        stop["signal"] = stop["signal"] or signum

    handled = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, request_stop) for sig in handled}
    code = 0
    try:
        while stop["signal"] is None:
            exited = [(name, p) for name, p in procs.items() if p.poll() is not None]
            if exited:
                name, proc = exited[0]
                console.print(f"[red]{name} exited with status {proc.returncode}[/red]")
                code = proc.returncode or 1
                break
            time.sleep(0.2)
        else:
            console.print("stopping...")
        # Signal both first, then wait: the API and the worker shut down in parallel. A second
        # Ctrl-C only sets the flag again: it must not cut the stop short.
        for proc in procs.values():
            if proc.poll() is None:
                _signal_group(proc, signal.SIGTERM)
        for proc in procs.values():
            wait_or_kill(proc, stop_timeout)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    console.print("stopped")
    return code


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


# --------------------------------------------------------------------------- commands


def _up(host: str, port: int, data_dir: Optional[Path], stop_timeout: float) -> int:
    _use_data_dir(data_dir)
    from store import migrate
    from store.settings import get_settings

    settings = get_settings()
    migrate.upgrade(settings.database_url)
    key, created = ensure_local_key(settings.data_dir)
    url = f"http://{host}:{port}"
    console.print(f"BroRL at [bold]{url}[/bold]  (data dir {settings.data_dir})", highlight=False,
                  soft_wrap=True)
    console.print(f"API key{' (new)' if created else ''}: {key}", highlight=False, soft_wrap=True)
    console.print(f"  export BRORL_URL={url} BRORL_API_KEY={key}", highlight=False, soft_wrap=True)
    console.print(f"Dashboard (logs this browser tab in): {dashboard_url(url, key)}", highlight=False,
                  soft_wrap=True)
    sys.stdout.flush()
    # --limit-concurrency: past that many connections and requests at once uvicorn answers
    # 503 instead of accepting more (docs/hardening.md: what is bounded where).
    api_argv = [sys.executable, "-m", "uvicorn", "api.app:create_app", "--factory",
                "--host", host, "--port", str(port), "--timeout-graceful-shutdown", "5",
                "--limit-concurrency", str(UP_LIMIT_CONCURRENCY)]
    # `kill -USR1 <pid>` prints where every thread of `brorl up` is (for a stop that hangs).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    _local_inference_port(host)
    workers = {"worker": up_worker_command(settings)}
    for i, ray_driver in enumerate(up_ray_driver_commands(settings), 1):
        workers[f"ray driver worker {i}"] = ray_driver
    declare_queues(settings, list(workers.values()))
    procs = {"api": _spawn(api_argv)}
    procs.update((name, _spawn(argv)) for name, argv in workers.items())
    procs["inference"] = _spawn(INFERENCE_SERVER)
    return supervise(procs, stop_timeout)


INFERENCE_SERVER = [sys.executable, "-m", "worker.inference_server"]


def _local_inference_port(host: str) -> None:
    """`brorl up`'s inference server listens on a free port beside the API unless one is set;
    the children read it from the environment (docs/inference.md)."""
    from store.settings import reset_settings_cache

    if not os.environ.get("BRORL_INFERENCE_PORT"):
        os.environ["BRORL_INFERENCE_PORT"] = str(_free_port(host))
    os.environ.setdefault("BRORL_INFERENCE_HOST", host)
    reset_settings_cache()


def _wait_ready(client, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not client.ready():
        if proc.poll() is not None:
            raise RuntimeError(f"`brorl up` exited with status {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the API was not ready after {timeout:.0f}s")
        time.sleep(0.5)


def _demo(data_dir: Path, port: Optional[int], spec_path: Path, ready_timeout: float) -> int:
    from cli.client import BrorlClient
    from cli.remote import follow_job, load_spec_file, print_outcome

    data_dir = data_dir.expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    host, port = "127.0.0.1", port or _free_port("127.0.0.1")
    log_path = data_dir / "stack.log"
    console.print(f"starting the embedded stack on port {port} (logs: {log_path})", highlight=False)
    with open(log_path, "ab") as log:
        stack = _spawn([sys.executable, "-m", "cli.main", "up", "--host", host, "--port", str(port),
                        "--data-dir", str(data_dir)], stdout=log, stderr=subprocess.STDOUT)
    try:
        key_file = data_dir / "local.key"
        client = BrorlClient(f"http://{host}:{port}", None, timeout=60.0)
        _wait_ready(client, stack, ready_timeout)
        key = key_file.read_text().strip()
        client = BrorlClient(client.base_url, key, timeout=60.0)
        job = client.submit(load_spec_file(spec_path))
        console.print(f"submitted {job['id']} ({spec_path.name}); following it", highlight=False)
        link = dashboard_url(client.base_url, key, f"/jobs/{job['id']}")
        console.print(f"watch it in the browser: {link}", highlight=False, soft_wrap=True)
        final = follow_job(client, job["id"])
        code = print_outcome(final)
        if final["status"] == "succeeded" and client.list_checkpoints(job["id"]).get("data"):
            dest = client.download(job["id"], None, data_dir / "checkpoints" / job["id"])
            console.print(f"final checkpoint downloaded to {dest}", highlight=False, soft_wrap=True)
        return code
    finally:
        if stack.poll() is None:
            stack.send_signal(signal.SIGINT)  # `up` stops its own children
        try:
            stack.wait(timeout=60)
        except subprocess.TimeoutExpired:
            stop_process(stack, 5)


def register(app: typer.Typer) -> None:
    """Add the commands that run the service, and `brorl keys`, to `app`."""
    _register_service(app)
    keys_app = typer.Typer(no_args_is_help=True, help="API keys.")
    app.add_typer(keys_app, name="keys")
    _register_keys(keys_app)


def _register_service(app: typer.Typer) -> None:
    @app.command()
    def up(host: str = typer.Option("127.0.0.1", "--host"),
           port: int = typer.Option(8000, "--port"),
           data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Default: BRORL_DATA_DIR or ~/.brorl."),
           stop_timeout: float = typer.Option(15.0, "--stop-timeout", help="Seconds before SIGKILL.")):
        """Run the API and one worker on SQLite files in the data dir (Ctrl-C stops both)."""
        raise typer.Exit(_up(host, port, data_dir, stop_timeout))

    @app.command()
    def demo(data_dir: Path = typer.Option(Path(".brorl/demo"), "--data-dir"),
             port: Optional[int] = typer.Option(None, "--port", help="Default: a free port."),
             spec: Path = typer.Option(DEMO_SPEC, "--spec", exists=True, dir_okay=False),
             ready_timeout: float = typer.Option(180.0, "--ready-timeout")):
        """Start the embedded stack, submit the demo job, follow it, stop; 0 iff it succeeded."""
        try:
            code = _demo(data_dir, port, spec, ready_timeout)
        except Exception as exc:  # noqa: BLE001 - one readable line, not a traceback
            console.print(f"[red]demo failed: {exc}[/red]", highlight=False)
            code = 1
        raise typer.Exit(code)

    @app.command()
    def worker(queues: Optional[str] = typer.Option(
                   None, "--queues", "-Q", help="Comma list of queues (default: gpu; `ray`: "
                   "multi-node jobs, driven without a GPU)."),
               gpus: Optional[int] = typer.Option(
                   None, "--gpus", min=1, help="Serve jobs asking for this many GPUs "
                   "(queue gpu for 1, gpu-G otherwise); added to --queues."),
               beat: bool = typer.Option(False, "--beat", "-B",
                                         help="Also run the reaper's schedule (one per deployment!)."),
               pool: str = typer.Option("solo", "--pool", help="solo | prefork"),
               concurrency: int = typer.Option(1, "--concurrency", "-c"),
               loglevel: str = typer.Option("INFO", "--loglevel"),
               inference: bool = typer.Option(False, "--inference", help="Also run an inference "
                                              "server for chat on checkpoints (docs/inference.md).")):
        """Run a Celery worker for training jobs (queue gpu, or --gpus G's; one job at a time)."""
        from store.settings import get_settings
        from worker.celery_app import app as celery_app

        get_settings()  # creates the data dir (the beat schedule file lives there)
        if inference:  # its own process: a training task must not hold up a chat
            _spawn(INFERENCE_SERVER)
        celery_app.worker_main(worker_argv(worker_queues(queues, gpus), beat, pool, concurrency,
                                           loglevel))

    @app.command()
    def migrate():
        """Bring the database (BRORL_DATABASE_URL) up to the newest schema."""
        from store import migrate as store_migrate

        store_migrate.upgrade()
        console.print("database at head")


def _register_keys(keys_app: typer.Typer) -> None:
    @keys_app.command("create")
    def keys_create(tenant: str = typer.Option(..., "--tenant"),
                    data_dir: Optional[Path] = typer.Option(None, "--data-dir")):
        """Create an API key for TENANT (created if new); the key is shown only this once."""
        _use_data_dir(data_dir)
        from store import keys
        from store.db import session_scope

        with session_scope() as s:
            key = keys.create_key(s, tenant)
        typer.echo(key)

    @keys_app.command("list")
    def keys_list(tenant: Optional[str] = typer.Option(None, "--tenant"),
                  data_dir: Optional[Path] = typer.Option(None, "--data-dir")):
        """List API keys: id, tenant, display prefix, created, revoked (secrets are not stored)."""
        _use_data_dir(data_dir)
        from store import keys
        from store.db import session_scope

        with session_scope() as s:
            rows = [(k.id, name, k.prefix, k.created_at, k.revoked_at)
                    for k, name in keys.list_all_keys(s, tenant)]
        typer.echo("id\ttenant\tprefix\tcreated\trevoked")
        for key_id, name, prefix, created, revoked in rows:
            typer.echo(f"{key_id}\t{name}\t{prefix}\t{created:%Y-%m-%d %H:%M}\t"
                       f"{f'{revoked:%Y-%m-%d %H:%M}' if revoked else '-'}")

    @keys_app.command("revoke")
    def keys_revoke(ref: str = typer.Argument(..., help="A key id or prefix, as `keys list` shows."),
                    data_dir: Optional[Path] = typer.Option(None, "--data-dir")):
        """Revoke an API key at once: its next request is a 401."""
        _use_data_dir(data_dir)
        from store import keys
        from store.db import session_scope

        with session_scope() as s:
            found = keys.find_keys(s, ref)
            if len(found) != 1:
                typer.echo(f"{'no key' if not found else f'{len(found)} keys'} match {ref!r}; "
                           f"give a key id from `brorl keys list`", err=True)
                raise typer.Exit(1)
            revoked = keys.revoke_key(s, found[0].id)
        typer.echo(f"revoked key {found[0].id}" if revoked else f"key {found[0].id} was already revoked")
