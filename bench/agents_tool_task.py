"""Agent training evidence: a tool-use task `builtin:tiny` learns with an `add` tool.

The task: reasoning-gym chain_sum with two 3-digit terms (`+` or `-`), which the 0.6 M-parameter
character-level model cannot add in its head, through the built-in tools environment
(`task.env.type: tools`) with one tenant tool, `add(a: int, b: int) -> int`, run in the
sandbox; the final <answer> is checked by the built-in verifier. The episode the model must
learn: a first turn `<tool_call>{"name":"add","arguments":{"a":361,"b":-220}}</tool_call>`, the
tool's answer as context, then `<answer>141</answer>`.

Subcommands (each job runs in a fresh child process, one torch thread):

  warm    the model: a fresh builtin:tiny warm-started on tool-call transcripts of the training
          questions (`trainer.models.tiny_tools`), stopped when its hold-out pass@1 over real
          two-turn episodes (the tool computed in-process for this stopping rule only) reaches
          `--aim`; saved under bench/out/agents_tool_task/model (reused when present).
  train   one job (`trainer.train`, the product's loop) from that model: eval pass@1 before and
          after, tool calls and tool errors per episode, time/* split per step.
  compare N = --n-small against N = --n-broad at equal samples (prompts_per_step x N x steps).
  notool  the baseline: the same sums and job without the tool, from builtin:tiny's own
          single-turn warm start capped at --warm-steps SFT steps (its own model cache).
  speed   generation cost of a 3-turn episode against one turn of the same total tokens
          (the multi-turn driver with the HF engine, lengths forced by ignore_eos).
  all     warm, compare, speed.

Figures are printed and written to bench/out/agents_tool_task/*.json.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import OUT, emit_result, run_child  # noqa: E402

HERE = OUT / "agents_tool_task"
TOOLS = '''def add(a: int, b: int) -> int:
    """Add two integers: a + b."""
    return a + b
'''
# The step's split (docs/metrics.md): engine, grader/verifier, environment, update, whole step.
STEP_KEYS = ("gen_s", "score_s", "train_s", "weight_sync_s", "step_s", "reward_mean", "truncated_frac",
             "response_len_mean", "keep_rate", "samples")
QUESTION = re.compile(r"(-?\d+) ([+-]) (\d+) =\s*$")


def base_spec(model_path: str, *, n: int = 16, prompts: int = 8, steps: int = 10, eval_every: int = 5,
              lr: float = 1e-4, seed: int = 0) -> dict:
    return {
        "spec_version": 1, "name": "agents-tool-sum", "seed": seed,
        "model": {"path": model_path, "dtype": "float32"},
        "task": {
            "reasoning_gym": {"name": "chain_sum",
                              "config": {"min_terms": 2, "max_terms": 2, "min_digits": 3, "max_digits": 3},
                              "train_size": 2000, "eval_size": 64, "eval_disjoint": True},
            "env": {"type": "tools", "tools": TOOLS, "max_turns": 3, "max_total_tokens": 200,
                    "tool_timeout_s": 10},
        },
        "rollout": {"engine": "hf", "schedule": [{"n": n, "prompts_per_step": prompts, "steps": steps}],
                    "max_new_tokens": 80},
        "optim": {"lr": lr},
        "algo": {"mini_batches": 1},
        "eval": {"every": eval_every, "samples_per_prompt": 4, "temperature": 1.0, "k": [1, 4]},
        "checkpoint": {"every": 1000, "keep_last": 1},
        "limits": {"max_wall_seconds": 3600},
    }


def call_of(question: str) -> tuple[int, int]:
    m = QUESTION.search(question)
    if m is None:
        raise ValueError(f"not a two-term sum: {question!r}")
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    return a, (b if op == "+" else -b)


def call_text(a: int, b: int) -> str:
    return '<tool_call>{"name":"add","arguments":{"a":%d,"b":%d}}</tool_call>' % (a, b)


# ----------------------------------------------------------------------------- warm start

def warm(args) -> dict:
    import torch

    torch.set_num_threads(1)
    from trainer.models.tiny import VOCAB, EOS, PAD, _decode, build_untrained, save_folder
    from trainer.models.tiny_tools import transcript_ids, warm_start_transcripts
    from trainer.rollouts.chat_tokens import plain_opening, plain_reply
    from trainer.rollouts.environments.tool_schema import schemas
    from trainer.rollouts.tool_calls import parse_turn
    from trainer.run import job_task, warm_start_holdout
    from trainer.spec import JobSpec
    from trainer.tasks.prompts import extract_answer, render_prompt
    from trainer.engines.hf_engine import HFEngine
    from trainer.models.tiny import encode
    from trainer.rollouts import SamplingConfig

    spec = JobSpec.model_validate(base_spec("builtin:tiny"))
    task = job_task(spec)
    tools = schemas(TOOLS, False)

    def opening(q: str) -> list[dict]:
        return [{"role": "user", "content": render_prompt(q).rstrip("\n")}]

    transcripts = []
    for ex in task.train:
        a, b = call_of(ex.question)
        transcripts.append(transcript_ids(opening(ex.question), tools, [
            (call_text(a, b), [{"role": "tool", "content": json.dumps(a + b)}]),
            (f"<answer>{ex.answer}</answer>", None)]))
    holdout = warm_start_holdout(task)

    def score(model, seed: int) -> float:
        """pass@1 of one temperature-1 two-turn episode per hold-out question."""
        engine = HFEngine(model, VOCAB[EOS], seed=seed, pad_id=VOCAB[PAD])
        prompts = [encode(plain_opening(opening(ex.question), tools)) for ex in holdout]
        first = engine.generate(prompts, SamplingConfig(n=1, max_new_tokens=80, seed=seed))
        ctx, finals = [], [None] * len(holdout)
        for i, ids in enumerate(first.token_ids):
            turn = parse_turn(_decode(ids), turn=0, fmt="hermes", truncated=not first.finished[i])
            call = turn.tool_calls[0] if turn.tool_calls else None
            try:
                value = json.dumps(int(call.arguments["a"]) + int(call.arguments["b"])) if call else None
            except (KeyError, TypeError, ValueError):
                value = "error: bad arguments"
            if value is None:
                finals[i] = _decode(ids)
            else:
                ctx.append((i, prompts[i] + list(ids) + encode(plain_reply([{"role": "tool", "content": value}]))))
        if ctx:
            second = engine.generate([c for _, c in ctx], SamplingConfig(n=1, max_new_tokens=30, seed=seed + 1))
            for (i, _), ids in zip(ctx, second.token_ids):
                finals[i] = _decode(ids)
        ok = [extract_answer(f or "") == ex.answer for f, ex in zip(finals, holdout)]
        return sum(ok) / len(ok)

    model, tokenizer = build_untrained(spec.seed, max_position_embeddings=2048)
    seed = spec.seed
    if getattr(args, "more", False):   # go on from the saved model (fresh draws: another seed)
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(HERE / "model", torch_dtype=torch.float32)
        seed = spec.seed + 1000 + int(json.loads((HERE / "model" / "warm_start.json").read_text())["steps"])
    report = warm_start_transcripts(model, transcripts, seed=seed, score_fn=score, aim=args.aim,
                                    max_steps=args.warm_steps, log=lambda m: print(m, file=sys.stderr, flush=True))
    out = HERE / "model"
    save_folder(model, tokenizer, out)
    (out / "warm_start.json").write_text(json.dumps(report, indent=1))
    return {"model": str(out), **report, "transcripts": len(transcripts),
            "example": _decode(transcripts[0][1])}


# ----------------------------------------------------------------------------- train

class Sink:
    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.kept: dict[int, list[dict]] = {}

    def metrics(self, step, values):
        self.rows.append({"step": step, **values})
        print(json.dumps({k: v for k, v in {"step": step, **values}.items()
                          if k.startswith(("eval/pass@1", "env/", "time/", "reward_mean")) or k in STEP_KEYS
                          or k == "step"}), file=sys.stderr, flush=True)

    def event(self, type, data):
        pass

    def checkpoint(self, step, path, nbytes, sha256):
        pass

    def samples(self, step, rows):
        self.kept.setdefault(step, rows[:4])


def train_child(cfg: dict) -> None:
    import torch

    torch.set_num_threads(1)
    from trainer import train
    from trainer.spec import JobSpec

    body = base_spec(cfg["model"], n=cfg["n"], prompts=cfg["prompts"], steps=cfg["steps"],
                     eval_every=cfg["eval_every"], lr=cfg["lr"], seed=cfg.get("seed", 0))
    warm = None
    if cfg.get("notool"):  # the baseline: no tool, builtin:tiny's own single-turn warm start
        del body["task"]["env"]
        body["model"] = {"path": "builtin:tiny", "dtype": "float32"}
    spec = JobSpec.model_validate(body)
    if cfg.get("notool"):
        from trainer.run import prepare_tiny_model

        t0 = time.perf_counter()
        prepare_tiny_model(spec, None, max_sft_steps=cfg["warm_steps"])  # then found in the cache by train
        warm = time.perf_counter() - t0
    sink = Sink()
    t0 = time.perf_counter()
    train(spec, sink, lambda: False, out_dir=Path(cfg["out_dir"]))
    wall = time.perf_counter() - t0
    evals = [{"step": r["step"], **{k: r[k] for k in r if k.startswith("eval/")}} for r in sink.rows
             if "eval/pass@1" in r]
    steps = [r for r in sink.rows if "step_s" in r]

    def mean(key: str) -> float | None:
        vals = [float(r[key]) for r in steps if r.get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    keys = sorted({k for r in steps for k in r if k.startswith(("time/", "env/")) or k in STEP_KEYS})
    first_sample = next(iter(sink.kept.values()), [])
    emit_result({"config": cfg, "wall_s": wall, "warm_s": warm, "evals": evals, "rows": sink.rows,
                 "means": {k: mean(k) for k in keys},
                 "sample": first_sample[0] if first_sample else None})


def run_train(args, n: int, prompts: int, steps: int, notool: bool = False) -> dict:
    cfg = {"model": str((HERE / "model").resolve()), "n": n, "prompts": prompts, "steps": steps,
           "eval_every": args.eval_every, "lr": args.lr, "seed": args.seed, "notool": notool,
           "warm_steps": args.warm_steps,
           "out_dir": str(HERE / "work" / f"{'notool_' if notool else ''}n{n}_p{prompts}_s{steps}_seed{args.seed}")}
    print(f"train: N={n} x {prompts} prompts x {steps} steps{' without the tool' if notool else ''}", flush=True)
    env = {"OMP_NUM_THREADS": "1"}
    if notool:  # its own model cache: the baseline's warm start is capped at --warm-steps
        env["BRORL_CACHE_DIR"] = str((HERE / "notool_cache").resolve())
    res = run_child([__file__, "--child", json.dumps(cfg)], timeout=args.timeout, env=env)
    evals = res["evals"]
    print(f"  eval pass@1: " + ", ".join(f"step {e['step']}: {e['eval/pass@1']:.3f}" for e in evals))
    m = res["means"]
    print(f"  per step: " + ", ".join(f"{k} {v:.3f}" for k, v in m.items() if v is not None))
    print(f"  wall {res['wall_s']:.0f} s", flush=True)
    return res


# ----------------------------------------------------------------------------- speed

def speed_child(cfg: dict) -> None:
    """3 turns of T tokens with 2 replies of R tokens, against 1 turn of 3T + 2R tokens."""
    import asyncio  # noqa: F401

    import torch

    torch.set_num_threads(1)
    from trainer.engines.hf_engine import HFEngine
    from trainer.models.tiny import EOS, PAD, VOCAB, build_tokenizer, build_untrained
    from trainer.rollouts import SamplingConfig
    from trainer.rollouts.environments.base import EnvReply
    from trainer.rollouts.multiturn import run_episodes
    from trainer.tasks.base import Example

    model, _ = build_untrained(0, max_position_embeddings=4096)
    model.eval()
    tok = build_tokenizer()
    T, R, N, P = cfg["turn_tokens"], cfg["reply_chars"], cfg["n"], cfg["prompts"]

    class Forced(HFEngine):
        def generate(self, prompts, sampling, *, ignore_eos=False):
            return super().generate(prompts, sampling, ignore_eos=True)

    class Ep:
        async def start(self):
            return [{"role": "user", "content": "State the final answer to: 361 - 220 =\nAnswer in <answer></answer>."}]

        async def step(self, turn):
            return EnvReply(messages=[{"role": "tool", "content": "7" * R}], done=False, tool_calls=1)

        async def finish(self, transcript):
            return 0.0

        async def close(self):
            pass

    class Env:
        tools = None

        def episode(self, example, sample):
            return Ep()

        def close(self):
            pass

    class NoScore:
        def score(self, texts, examples, truncated):
            raise AssertionError

    examples = [Example(question=f"q{i}", answer="0") for i in range(P)]
    reply_len = len(tok(f"\n<tool_response>{'7' * R}</tool_response>\n", add_special_tokens=False)["input_ids"])
    total = 3 * T + 2 * reply_len
    out = {"turn_tokens": T, "reply_tokens": reply_len, "episode_tokens": total, "n": N, "prompts": P,
           "repeats": cfg["repeats"]}
    out["three_turns"], out["one_turn"] = [], []
    # Interleaved repeats: the load of shared cores drifts from minute to minute.
    for r in range(cfg["repeats"]):
        for name, turns, per_turn in (("three_turns", 3, T), ("one_turn", 1, total)):
            engine = Forced(model, VOCAB[EOS], seed=r, pad_id=VOCAB[PAD])
            t0 = time.perf_counter()
            eps = run_episodes(engine, tok, Env(), NoScore(), examples,
                               SamplingConfig(n=N, max_new_tokens=per_turn, seed=r),
                               max_turns=turns, max_total_tokens=total, reward_mode="env")
            out[name].append({"wall_s": time.perf_counter() - t0, "gen_s": eps.gen_s, "env_s": eps.env_s,
                              "tokens": sum(len(c) for c in eps.completion_ids),
                              "model_tokens": sum(sum(m) for m in eps.loss_mask) if eps.loss_mask else
                              sum(len(c) for c in eps.completion_ids)})
    emit_result(out)


def speed(args) -> dict:
    cfg = {"turn_tokens": args.turn_tokens, "reply_chars": args.reply_chars, "n": args.speed_n,
           "prompts": args.speed_prompts, "repeats": args.repeats}
    res = run_child([__file__, "--speed-child", json.dumps(cfg)], timeout=args.timeout,
                    env={"OMP_NUM_THREADS": "1"})
    for name in ("three_turns", "one_turn"):
        g = sorted(t["gen_s"] for t in res[name])
        print(f"  {name}: generation {g[len(g) // 2]:.2f} s (median of {len(g)}), "
              f"completion tokens {res[name][0]['tokens']}, model tokens {res[name][0]['model_tokens']}")
    med = {k: sorted(t["gen_s"] for t in res[k])[len(res[k]) // 2] for k in ("three_turns", "one_turn")}
    res["ratio_gen"] = med["three_turns"] / med["one_turn"]
    print(f"  3-turn / 1-turn generation time: {res['ratio_gen']:.2f}x", flush=True)
    return res


# ----------------------------------------------------------------------------- main

def save(name: str, payload: dict) -> Path:
    HERE.mkdir(parents=True, exist_ok=True)
    path = HERE / f"{name}.json"
    path.write_text(json.dumps(payload, indent=1, default=str))
    print(f"wrote {path}", flush=True)
    return path


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        return train_child(json.loads(sys.argv[2]))
    if len(sys.argv) > 2 and sys.argv[1] == "--speed-child":
        return speed_child(json.loads(sys.argv[2]))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["warm", "train", "notool", "compare", "speed", "all"])
    ap.add_argument("--aim", type=float, default=0.30, help="warm start: stop at this hold-out pass@1")
    ap.add_argument("--warm-steps", type=int, default=600)
    ap.add_argument("--more", action="store_true", help="warm: go on from the saved model for --warm-steps more")
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--n-small", type=int, default=16)
    ap.add_argument("--n-broad", type=int, default=64)
    ap.add_argument("--samples", type=int, default=128, help="compare: samples per step (prompts x N)")
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0,
                    help="train/compare: the job's seed (its questions, split and sampling; the model stays)")
    ap.add_argument("--turn-tokens", type=int, default=40)
    ap.add_argument("--reply-chars", type=int, default=4)
    ap.add_argument("--speed-n", type=int, default=16)
    ap.add_argument("--speed-prompts", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=3600)
    args = ap.parse_args()
    if args.what in ("warm", "all"):
        if (HERE / "model" / "config.json").exists() and not args.more:
            print(f"warm: reusing {HERE / 'model'}")
        else:
            res = run_child([__file__, "--warm-child", json.dumps(vars(args))], timeout=args.timeout,
                            env={"OMP_NUM_THREADS": "1"})
            print(f"warm: {res['steps']} SFT steps, hold-out pass@1 {res['pass_rate']:.3f}, "
                  f"{res['seconds']:.0f} s", flush=True)
            save("warm_more" if args.more else "warm", res)
    if args.what == "train":
        save(f"train_n{args.n}", run_train(args, args.n, args.prompts, args.steps))
    if args.what == "notool":  # the same sums and job without the tool, from builtin:tiny's own warm start
        save("notool" if args.seed == 0 else f"notool_seed{args.seed}",
             run_train(args, args.n, args.prompts, args.steps, notool=True))
    if args.what in ("compare", "all"):
        out = {}
        for n in (args.n_small, args.n_broad):
            out[f"n{n}"] = run_train(args, n, args.samples // n, args.steps)
        save("compare" if args.seed == 0 else f"compare_seed{args.seed}", out)
    if args.what in ("speed", "all"):
        save("speed", speed(args))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--warm-child":
        ns = argparse.Namespace(**json.loads(sys.argv[2]))
        emit_result(warm(ns))
    else:
        main()
