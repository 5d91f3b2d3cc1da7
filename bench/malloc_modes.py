"""glibc's malloc modes (`BRORL_MALLOC`, trainer/malloc.py) side by side: step, update and peak RSS.

Each (shape, mode) is one fresh process running `bench/vs_trl.py`'s own trainer child
(`build_run` + `run_step`, one thread) with `BRORL_MALLOC=<mode>` and no
`MALLOC_MMAP_THRESHOLD_` (but for the `mmap_<size>` modes below); the modes alternate within
each shape, so the load moves all of them alike. Two more candidates, for the record: `trim_micro` (`trim`, and
`malloc_trim(0)` after every micro-batch's backward too: this script wraps the update's
`_micro_step`) and `jemalloc` (glibc left as it is, jemalloc preloaded with `LD_PRELOAD`: a
system library, which a pip install does not bring). And `mmap_<size>` (e.g. `mmap_1m`,
`mmap_4m`, `mmap_256k`): glibc's default mode with `MALLOC_MMAP_THRESHOLD_` fixed at that size in
the child's environment (which `trainer/malloc.py` leaves alone), to try thresholds between
64 KiB and glibc's dynamic one; `mmap_4m_trim64m` also sets `MALLOC_TRIM_THRESHOLD_` (a fixed
mmap threshold leaves the heap's trim threshold at 128 KiB, where the dynamic one doubles it).
Shapes: `short` = the 24 M model at N = 64 x 2, `max_new_tokens` 24; `m24` = `bench/vs_trl.py`'s
`m24` (N = 512 x 1, 24 tokens); `long` = `m24_64x2_t256` (N = 64 x 2, 256 tokens). Peak RSS is the process's ru_maxrss.

    .venv/bin/python bench/malloc_modes.py [--modes trim,mmap_threshold,default] [--rounds 1]

Writes bench/out/malloc_modes.json and prints the table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEFAULT_SPEC, OUT, run_child  # noqa: E402
from vs_trl import launch  # noqa: E402

SHAPES = {"short": ("24m", 64, 2, 24), "m24": ("24m", 512, 1, 24), "long": ("24m", 64, 2, 256)}
JEMALLOC = "/lib/x86_64-linux-gnu/libjemalloc.so.2"


def child(cfg: dict) -> None:
    """vs_trl.py's trainer child, with a trim after every micro-batch when `cfg["micro"]`."""
    import trainer.optim.update as upd
    from trainer.malloc import release_freed
    from vs_trl import child_brorl

    if cfg["micro"]:
        plain = upd._micro_step

        def trimmed(*a, **k):
            try:
                return plain(*a, **k)
            finally:
                release_freed()

        upd._micro_step = trimmed
    child_brorl(cfg)


def mode_env(mode: str) -> dict[str, str]:
    if mode == "trim_micro":
        return {"BRORL_MALLOC": "trim"}
    if mode == "jemalloc":
        return {"BRORL_MALLOC": "default", "LD_PRELOAD": JEMALLOC}
    if mode.startswith("mmap_") and mode != "mmap_threshold":
        size, _, trim = mode[5:].partition("_trim")
        env = {"BRORL_MALLOC": "default", "MALLOC_MMAP_THRESHOLD_": str(size_bytes(size))}
        return {**env, "MALLOC_TRIM_THRESHOLD_": str(size_bytes(trim))} if trim else env
    return {"BRORL_MALLOC": mode}


def size_bytes(size: str) -> int:
    """`256k` / `1m` / `4m` -> bytes."""
    units = {"k": 1024, "m": 1024 * 1024}
    return int(size[:-1]) * units[size[-1].lower()] if size[-1].lower() in units else int(size)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default="trim,mmap_threshold,default")
    ap.add_argument("--shapes", default="short,long")
    ap.add_argument("--rounds", type=int, default=1, help="times each (shape, mode) runs, interleaved")
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    base = {"spec": str(DEFAULT_SPEC), "threads": args.threads, "mbt": 4096, "warmup": args.warmup,
            "steps": 1, "profile": False}
    dirs = launch("prep", {**base, "need": ["24m"]}, 3600)
    os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)  # run_child passes os.environ on
    env = {"OMP_NUM_THREADS": str(args.threads), "BRORL_TORCH_THREADS": str(args.threads)}
    rows = []
    for shape in args.shapes.split(","):
        model, n, prompts, max_new = SHAPES[shape]
        cfg = {**base, "shape": shape, "model": model, "model_dir": dirs[model], "n": n, "prompts": prompts,
               "max_new": max_new, "trl_micro": 64}
        for r in range(args.rounds):
            for mode in args.modes.split(","):
                res = run_child([__file__, "--child", json.dumps({**cfg, "micro": mode == "trim_micro"})],
                                timeout=1800, env={**env, **mode_env(mode)})
                last = res["steps"][-1]
                row = {"shape": shape, "mode": mode, "round": r, "step_s": last["step_s"], "gen_s": last["gen_s"],
                       "update_s": last["update_s"], "env": mode_env(mode), "peak_rss_mb": res["peak_rss_mb"],
                       "response_len_mean": last["response_len_mean"], "load": os.getloadavg()[0]}
                rows.append(row)
                print(f"{shape} {mode}: step {row['step_s']:.1f} s (gen {row['gen_s']:.1f}, update "
                      f"{row['update_s']:.1f}), peak RSS {row['peak_rss_mb']:.0f} MiB, load {row['load']:.1f}",
                      flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "malloc_modes.json"
    saved = json.loads(path.read_text()) if path.exists() else []
    path.write_text(json.dumps(saved + rows, indent=1))
    print("\n| shape | mode | step s | generation s | update s | peak RSS MiB |\n| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['shape']} | {r['mode']} | {r['step_s']:.1f} | {r['gen_s']:.1f} | {r['update_s']:.1f} "
              f"| {r['peak_rss_mb']:.0f} |")


if __name__ == "__main__":
    main()
