"""``exgrpo gpu-smoke``: a GPU node's first contact, in minutes.

It writes a random Qwen2 (``save_pretrained``, SmolLM2's tokenizer; or takes ``--model``) and a few
arithmetic questions, then runs ``experiments/gpu-smoke.yaml`` through the CLI as a user would:

1. ``exgrpo train`` for 2 steps (veRL on one GPU, vLLM rollouts, a checkpoint with its experience pool
   at every step);
2. ``exgrpo train --resume`` to step 3, which must start from step 2's checkpoint;
3. ``exgrpo eval`` of step 3's checkpoint (merged into an HF directory, scored by vLLM).

It then prints one line per path that only CUDA takes, read from what the job printed
(:mod:`exgrpo.backends.verl.path_lines`): vLLM's sleep mode, the CUDA IPC weight sync, FSDP in bf16,
NCCL, and the checkpoint, the resume and the evaluation. Exit 0 when every path ran as it should.
``--device cpu`` runs the same on the CPU job environment (each path in its CPU form).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

from exgrpo.atomic import directory_atomic
from exgrpo.backends.verl.checkpoints import POOL_FILE, why_torn
from exgrpo.backends.verl.path_lines import verdicts
from exgrpo.cluster import code_root
from exgrpo.paths import project_root

CONFIG = "experiments/gpu-smoke.yaml"
PYTHON = {"cuda": ".venv-gpu/bin/python", "cpu": ".venv-job/bin/python"}
"""The job environment of each device (``make gpu-env``, ``make job-env``), in the project."""
STEP_TIMEOUT_S = 1800
"""The longest one command of the smoke may take (start-up, compile and two steps of a tiny model)."""


class Check(NamedTuple):
    """One path's verdict: whether it ran as it should, its name, and its line (or why not)."""

    ok: bool
    path: str
    text: str

    def __str__(self) -> str:
        return f"{'ok    ' if self.ok else 'FAILED'} {self.path}: {self.text}"


def in_project(relative: str) -> Path:
    """``relative`` in the checkout this code runs from, whatever directory the command is started in (else
    in the project of the working directory, an installed package's); the checkout's when neither holds it."""
    for root in (code_root(), project_root()):
        if (root / relative).exists():
            return root / relative
    return code_root() / relative


def write_model(out: Path) -> Path:
    """A random Qwen2 with heads of 64 dimensions (every vLLM attention backend has them), SmolLM2's
    tokenizer and chat template beside it; written once (a directory that holds a config is kept)."""
    import shutil

    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from exgrpo.policies.lm.smollm2 import ensure_smollm2

    if (out / "config.json").is_file():
        return out
    source = ensure_smollm2()
    with directory_atomic(out) as tmp:
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            shutil.copy(source / name, tmp / name)
        tok = AutoTokenizer.from_pretrained(tmp, local_files_only=True)
        config = Qwen2Config(vocab_size=len(tok), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                             tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            Qwen2ForCausalLM(config).save_pretrained(tmp)
    return out


def question_rows(n: int, start: int) -> list[dict]:
    """``n`` questions "What is a + b?" in veRL's RLHFDataset layout, ``extra_info.index`` from ``start``."""
    rows = []
    for i in range(start, start + n):
        a, b = i % 7 + 1, i % 5 + 2
        rows.append({"data_source": "arith", "ability": "math",
                     "prompt": [{"role": "user", "content": f"What is {a} + {b}? Put the final answer in \\boxed{{}}."}],
                     "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                     "extra_info": {"index": i, "split": "train"}})
    return rows


def write_questions(out: Path) -> dict[str, Path]:
    import pandas as pd

    out.mkdir(parents=True, exist_ok=True)
    files = {"train": out / "train.parquet", "val": out / "val.parquet"}
    for split, (n, start) in {"train": (32, 0), "val": (8, 100)}.items():
        tmp = files[split].with_suffix(".parquet.tmp")
        pd.DataFrame(question_rows(n, start)).to_parquet(tmp, index=False)
        os.replace(tmp, files[split])
    return files


def settings(device: str, model: Path, questions: dict[str, Path], python: str, output_dir: Path) -> list[str]:
    """The ``--set`` flags every command of the smoke shares."""
    return [f"--set=policy.path={model}", f"--set=task.path={questions['train']}",
            f"--set=task.val_path={questions['val']}", f"--set=backend.verl.device={device}",
            f"--set=backend.verl.python={python}", f"--output-dir={output_dir}"]


def _exgrpo(*args: str, log: Path) -> tuple[int, str]:
    """One ``exgrpo`` command, its output streamed into ``log`` (``tail -f`` it); -> (exit status, its
    last line of output)."""
    cmd = [sys.executable, "-m", "exgrpo.cli", *args]
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        start = f.tell()
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=STEP_TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            rc = -1
            f.write(f"gpu-smoke: no end after {STEP_TIMEOUT_S} s; stopped\n")
    with log.open() as f:
        f.seek(start)
        lines = [x for x in f.read().splitlines() if x.strip()]
    return rc, lines[-1] if lines else ""


def first_steps(metrics_dir: Path) -> list[int]:
    """The first training step of each attempt of a veRL run (``verl_metrics/attempt_*.jsonl``)."""
    firsts = []
    for path in sorted(metrics_dir.glob("attempt_*.jsonl")):
        steps = []
        for row in path.read_text().splitlines():
            try:
                record = json.loads(row)
                if "training/global_step" in record["data"]:
                    steps.append(int(record["step"]))
            except (ValueError, KeyError, TypeError):
                continue
        if steps:
            firsts.append(min(steps))
    return firsts


def run_checks(run_dir: Path, device: str) -> list[Check]:
    """What the run directory and its job log say of every path (after the two trains)."""
    log = (run_dir / "verl.log").read_text() if (run_dir / "verl.log").is_file() else ""
    checks = [Check(ok, name, text) for ok, name, text in verdicts(log, device)]
    step2 = run_dir / "checkpoints" / "global_step_2"
    torn = why_torn(step2) if step2.is_dir() else "not written"
    checks.append(Check(torn is None, "checkpoint", f"{step2} with its experience pool ({POOL_FILE})" if torn is None
                        else f"{step2}: {torn}"))
    firsts = first_steps(run_dir / "verl_metrics")
    resumed = len(firsts) >= 2 and firsts[-1] == 3
    checks.append(Check(resumed, "resume", "the second run started at step 3, from global_step_2" if resumed
                        else f"the attempts started at steps {firsts} (expected [1, 3])"))
    return checks


def smoke(device: str = "cuda", model: Path | None = None, python: str | None = None,
          output_dir: Path | None = None, echo=print) -> int:
    """Run the smoke; ``echo`` each line as it is known. 0 when every path ran as expected, else 1."""
    output_dir = output_dir or project_root() / "runs" / "gpu-smoke"
    python = python or str(in_project(PYTHON[device]))
    config = str(in_project(CONFIG))
    log = output_dir / "smoke.log"
    output_dir.mkdir(parents=True, exist_ok=True)
    echo(f"gpu-smoke on {device}: the job in {python}; every command's output in {log}")
    model = model or write_model(output_dir / "model")
    questions = write_questions(output_dir / "questions")
    shared = settings(device, model, questions, python, output_dir / "runs")
    run_dir = output_dir / "runs" / "gpu-smoke" / "seed0"
    checks: list[Check] = []

    def step(what: str, *args: str) -> bool:
        start = time.monotonic()
        rc, tail = _exgrpo(*args, log=log)
        echo(Check(rc == 0, what, f"{time.monotonic() - start:.0f} s" if rc == 0 else f"exit {rc}: {tail}"))
        return rc == 0

    if not (step("train", "train", config, "--no-progress", "--no-tracking", "--set=train.max_steps=2", *shared)
            and step("train --resume", "train", config, "--no-progress", "--no-tracking", "--resume", *shared)):
        checks = run_checks(run_dir, device) if run_dir.is_dir() else []
        for c in checks:
            echo(c)
        return 1
    checks = run_checks(run_dir, device)
    evaluated = step("eval", "eval", "--checkpoint", str(run_dir / "checkpoints" / "global_step_3"),
                     "--benchmarks", "val", "--python", python, "--no-tracking")
    for c in checks:
        echo(c)
    failed = [c.path for c in checks if not c.ok] + ([] if evaluated else ["eval"])
    echo(f"gpu-smoke: {'every path ran' if not failed else 'FAILED: ' + ', '.join(failed)} "
         f"(docs/gpu.md, \"First contact\": what each line means, and how to report a failure)")
    return 0 if not failed else 1
