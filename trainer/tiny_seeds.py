"""Regenerate the builtin:tiny warm starts shipped in `trainer/models/seeds/`.

    python -m trainer.tiny_seeds [SPEC ...]     # default: examples/demo.yaml

Each spec's model is built exactly as a worker builds it (`trainer.run.prepare_tiny_model`,
the full warm start, in a fresh cache) and copied under its cache key; seeds of other keys are
removed, so a change to the key (the task, the seed, the build's version) leaves no stale copy.
A seed is only a shortcut: without it the worker builds the same folder itself, in minutes.
"""
from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from trainer.models.tiny import SEEDS_DIR

DEMO_SPEC = Path(__file__).resolve().parents[1] / "examples" / "demo.yaml"
# What a seed folder keeps: the HF folder and the build's report, nothing the cache adds.
KEEP = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
        "tokenizer_config.json", "special_tokens_map.json", "warm_start.json")


def regenerate(specs: list[Path]) -> list[Path]:
    import os

    from trainer.run import prepare_tiny_model, tiny_model_key
    from trainer.spec import load_spec

    made = []
    with tempfile.TemporaryDirectory(prefix="brorl-seeds-") as cache:
        os.environ["BRORL_CACHE_DIR"] = cache  # read afresh by every trainer_settings()
        keys = []
        for path in specs:
            spec = load_spec(path)
            key = tiny_model_key(spec)
            keys.append(key)
            built = Path(cache) / "models" / f"tiny-{key}"
            out = SEEDS_DIR / f"tiny-{key}"
            shutil.rmtree(out, ignore_errors=True)  # else the cache would copy it, not build
            if not (built / "config.json").exists():
                prepare_tiny_model(spec, None)
            out.mkdir(parents=True)
            for name in KEEP:
                if (built / name).exists():
                    shutil.copy2(built / name, out / name)
            made.append(out)
    for old in SEEDS_DIR.glob("tiny-*"):
        if old.name.removeprefix("tiny-") not in keys:
            shutil.rmtree(old)
    return made


if __name__ == "__main__":
    for folder in regenerate([Path(a) for a in sys.argv[1:]] or [DEMO_SPEC]):
        print(folder)
