"""Golden runs: per-step metrics of fixed-seed runs, recorded before the replay core was shared
by the backends (pre-0.1.0) and compared bit for bit since. ``python -m tests.golden --record`` rewrites them.

The tiny-lm runs grade with the lenient answer format, the rule they were recorded under (strict
grading became the default before 0.1.0): a behaviour change, not a refactor."""

from __future__ import annotations

import json
import sys
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "golden_metrics.json"

TOY = {
    "task.max_operand": 6, "policy.hidden": 32, "policy.layers": 2, "algorithm.group_size": 4,
    "train.batch_size": 16, "train.epochs": 4, "train.lr": 1e-2, "train.mini_batches": 2,
    "train.fused_optimizer": False,  # recorded with the for-loop optimiser (pre-0.1.0 default; fused AdamW since 0.1.0)
}
EARLY = {"algorithm.replay_start_pass_rate": 0.0}
NOTEBOOK = {"algorithm.notebook.warm": 1, "algorithm.notebook.peak": 2, "algorithm.notebook.per": 8,
            "algorithm.notebook.sampling": "top"}  # recorded before proportional sampling was the default
TINY_LM = {
    "policy.model.sft_steps": 40, "policy.model.eval_questions": 0, "policy.model.hidden_size": 64,
    "policy.model.intermediate_size": 128, "policy.max_new_tokens": 24, "task.n_train": 48, "task.n_val": 16,
    "train.batch_size": 8, "algorithm.group_size": 4, "train.max_steps": 4, "train.eval_every_steps": 2, "train.eval_before_train": True, "train.lr": 1e-4,
    "task.answer_format": "boxed_or_last_number",
    # recorded before the static-KV decoder and the shared-prompt forward became the defaults (pre-0.1.0)
    "policy.decoder": "hf", "policy.share_prompt_forward": False, "policy.prepack_weights": False,
    "train.fused_optimizer": False,  # ... and the for-loop optimiser
    "policy.unpadded_scoring": False,  # ... and the padded training forward
}
RUNS = {
    "toy-grpo": ("experiments/toy-exgrpo.yaml", TOY, {"algorithm.replay": "none"}),
    "toy-exgrpo": ("experiments/toy-exgrpo.yaml", TOY, {"algorithm.replay": "buckets", **EARLY}),
    "toy-notebook": ("experiments/toy-exgrpo.yaml", TOY, {"algorithm.replay": "notebook", **NOTEBOOK}),
    "tiny-lm-grpo": ("experiments/tiny-lm.yaml", TINY_LM, {"algorithm.replay": "none"}),
    "tiny-lm-exgrpo": ("experiments/tiny-lm.yaml", TINY_LM, {"algorithm.replay": "buckets", **EARLY}),
    # recorded with the static-KV decoder, the pre-0.1.0 default (fused since 0.1.0)
    "tiny-lm-exgrpo-static-kv": (
        "experiments/tiny-lm.yaml", TINY_LM,
        {"algorithm.replay": "buckets", **EARLY, "policy.decoder": "static-kv", "policy.share_prompt_forward": True,
         "policy.prepack_weights": False},
    ),
}


#: Pinned CPU kernels and one thread: ATen, MKL and oneDNN pick code paths by the CPU's ISA
#: (AVX2 vs AVX-512 give different float rounding), so fixtures are recorded and checked with the
#: AVX2 paths on every machine, in a fresh process (the settings act at library load).
PINNED_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT", "ONEDNN_MAX_CPU_ISA": "AVX2",
    "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
}


def run(name: str, output_dir: Path) -> list[dict[str, float]]:
    """The per-step metrics (no timings) of golden run ``name``, trained in this process."""
    from exgrpo.backends.native.trainer import Trainer
    from exgrpo.config import load_experiment

    path, base, arm = RUNS[name]
    sets = {**base, **arm}
    cfg = load_experiment(path, {**sets, "output_dir": str(output_dir), "seed": 1})
    hist = Trainer(cfg).fit(progress=False).history
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in hist]


def run_pinned(name: str, output_dir: Path, cache: Path) -> list[dict[str, float]]:
    """:func:`run` in a fresh interpreter with :data:`PINNED_ENV` (what the fixtures hold)."""
    import os
    import subprocess

    env = {**os.environ, **PINNED_ENV, "EXGRPO_CACHE": str(cache)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--run", name, str(output_dir)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    if proc.returncode != 0:
        raise RuntimeError(f"golden run {name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__" and "--run" in sys.argv:
    i = sys.argv.index("--run")
    print(json.dumps(run(sys.argv[i + 1], Path(sys.argv[i + 2]))))

if __name__ == "__main__" and "--record" in sys.argv:
    # python -m tests.golden --record [NAME ...]: (re)record the named runs (default: all)
    import tempfile

    names = sys.argv[sys.argv.index("--record") + 1 :] or list(RUNS)
    out = json.loads(FIXTURES.read_text()) if FIXTURES.exists() else {}
    with tempfile.TemporaryDirectory() as d:
        out.update({name: run_pinned(name, Path(d) / name, Path(d) / "cache") for name in names})
    from exgrpo.atomic import write_text_atomic

    write_text_atomic(FIXTURES, json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURES}: {', '.join(names)}")
