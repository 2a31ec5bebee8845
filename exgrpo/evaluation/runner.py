"""Evaluate a checkpoint on benchmarks: avg@n and pass@k, each score with its sampling settings.

One function, :func:`score_checkpoint`, for every evaluation: ``exgrpo eval``, the evaluate flow and
the record of a finished run. ``val`` is the run's own held-out split and ``train`` its training probe
(:func:`train_probe`), both graded by the task's reward; every other name comes from the benchmark
registry (graded by math-verify in a process pool, :class:`exgrpo.rewards.MathVerifier`). LM policies
only for registry benchmarks: a toy MLP reads feature vectors, not text. Scores are named
``<benchmark>/<metric>`` (``val/avg_at_1``); greedy at the policy's own budget they are the run's own
``val/accuracy`` and ``train/accuracy``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from exgrpo.backends.base import build_policy, hf_checkpoint
from exgrpo.backends.base import read_checkpoint as backend_checkpoint
from exgrpo.config import ExperimentConfig, MLPPolicyConfig
from exgrpo.evaluation.benchmarks import (AnswerType, BenchmarkRequest, get_benchmark, list_benchmarks,
                                          parse_benchmark_spec, take_subset)
from exgrpo.evaluation.metrics import EvalSettings, Score, scores_of
from exgrpo.rewards import MathVerifier
from exgrpo.rewards.choice import LetterGrader


@dataclass
class CheckpointPolicy:
    """A checkpoint's policy, rebuilt: the run's config, its task, the policy with the checkpoint's weights."""

    config: ExperimentConfig
    task: Any
    policy: Any
    step: int
    """The training step the weights are from."""


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """The policy entries (``config``, ``model``, ``step``) of a checkpoint of any registered backend (a
    native ``step_*.pt`` file, a veRL ``global_step_N`` directory: :func:`exgrpo.backends.base.read_checkpoint`).
    Every backend loads weights_only."""
    path = Path(path)
    state = backend_checkpoint(path)
    if state is not None:
        return state
    if path.is_dir():
        raise FileNotFoundError(f"--checkpoint {path}: a directory that is not a veRL checkpoint (those are "
                                "runs/<name>/seed<k>/checkpoints/global_step_N/)")
    raise FileNotFoundError(f"--checkpoint {path}: no such file (checkpoints are runs/<name>/seed<k>/checkpoints/"
                            "step_*.pt, or global_step_N/ for a veRL run)")


def load_checkpoint_policy(path: str | Path) -> CheckpointPolicy:
    """The policy of a checkpoint (:func:`read_checkpoint`), in eval mode, as the backend of the run that
    wrote it builds it (:func:`exgrpo.backends.base.build_policy`)."""
    state = read_checkpoint(path)
    cfg = ExperimentConfig.model_validate_json(state["config"])
    task, policy = build_policy(cfg)
    policy.load_state_dict(state["model"])
    policy.eval()
    return CheckpointPolicy(cfg, task, policy, int(state.get("step", 0)))


def train_probe(task: Any) -> list[int]:
    """The training questions ``train/accuracy`` is measured on: min(|val|, |train|) of them, drawn
    with their own seed (a run's random streams are not touched)."""
    ids = list(task.train_ids)
    n = min(len(task.val_ids), len(ids))
    pick = np.random.default_rng(len(ids)).choice(len(ids), size=n, replace=False)
    return sorted(ids[i] for i in pick)


@torch.no_grad()
def greedy_accuracy(task: Any, policy: Any, generator: torch.Generator, probe: list[int]) -> tuple[dict[str, float], list[float]]:
    """How a run evaluates: greedy accuracy on the held-out questions (``val/accuracy``) and on the
    training questions ``probe`` (:func:`train_probe`; ``train/accuracy``: memorisation shows as the
    gap between them); and the held-out reward per validation question."""
    out, val_correct = {}, []
    for name, ids in (("val/accuracy", task.val_ids), ("train/accuracy", probe)):
        ro = policy.generate(task.prompts(ids), generator, greedy=True)
        rewards = task.rewards(ids, ro.tokens, ro.mask)
        out[name] = float(rewards.mean())
        if name == "val/accuracy":
            val_correct = [float(r) for r in rewards]
    return out, val_correct


RUN_SPLITS: tuple[str, ...] = ("val", "train")
"""The run's own question sets a spec may name: ``val`` (the held-out split) and ``train`` (the training
probe, :func:`train_probe`)."""


def parse_spec(spec: str) -> list[BenchmarkRequest]:
    """The benchmarks of ``spec`` (``"val:100,train,gsm8k:64"``) with their subset sizes (None: all), each
    a run's own split (:data:`RUN_SPLITS`) or a registry benchmark; a bad size, a name given twice or an
    unknown name is one line, before any work."""
    requests = parse_benchmark_spec(spec, validate=False)
    for r in requests:
        if r.name not in RUN_SPLITS and r.name not in list_benchmarks():
            raise ValueError(f"--benchmarks {r.name}: no such benchmark; name {', '.join(RUN_SPLITS)} (the run's own) "
                             f"or one of {', '.join(list_benchmarks())}")
    return requests


SPLIT_NAMES = {"val": "the run's held-out split", "train": "the run's training probe"}


def run_benchmarks(path: str | Path | CheckpointPolicy) -> str:
    """What a checkpoint is scored on when no benchmark is named: as its run evaluates, ``val,train``; an
    external HF model's (scored from its merged HF directory) ``val``, as its run has no probe at hand."""
    if not isinstance(path, CheckpointPolicy) and hf_checkpoint(Path(path)) is not None:
        return "val"
    return ",".join(RUN_SPLITS)


def _sample(policy, prompts: list, settings: EvalSettings, max_tokens: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """n rollouts per prompt row: list over samples of (tokens, mask)."""
    g = torch.Generator().manual_seed(settings.seed)
    greedy = settings.temperature == 0.0
    out = []
    with torch.no_grad():
        if hasattr(policy, "eos_id") and not (greedy and max_tokens == policy.max_response_length):
            # an LMPolicy with settings of this evaluation's own; greedy at its budget is the run's decoding, below
            for _ in range(1 if greedy else settings.n):
                ro = policy.sample(prompts, g, greedy, max_tokens, settings.temperature or 1.0, settings.top_p)
                out.append((ro.tokens, ro.mask))
        else:
            for _ in range(1 if greedy else settings.n):
                ro = policy.generate(prompts, g, greedy=greedy)
                out.append((ro.tokens, ro.mask))
    return out * (settings.n if greedy else 1)


def _text_codec(task):
    """(encode prompt text -> ids, decode response ids -> text, template name) of an LM task."""
    if hasattr(task, "prompt_fn"):  # reasoning-gym tasks carry the policy's chat template
        return task.prompt_fn, task.decode_fn, task.template
    tok = task.tokenizer
    return (lambda text: tok.encode(text, add_bos=True)), tok.decode, "raw-chars"


@dataclass
class Evaluation:
    """A checkpoint's scores, with the step and config of the run that wrote it."""

    scores: list[Score]
    step: int
    config: ExperimentConfig
    settings: EvalSettings = EvalSettings()
    """How the responses were sampled."""
    subsets: dict[str, int] = field(default_factory=dict)
    """Benchmark -> the problems of the subset it was scored on (absent: all of them)."""


def score_checkpoint(path: str | Path | CheckpointPolicy, spec: str | None = None,
                     settings: EvalSettings = EvalSettings(), workers: int = 2, python: str | None = None,
                     log: Path | None = None) -> Evaluation:
    """The scores of a checkpoint (a native ``step_*.pt``, a veRL ``global_step_N/``, or a policy already
    loaded) on the benchmarks of ``spec`` (e.g. ``"val,train,arith:100,gsm8k:64"``; None:
    :func:`run_benchmarks`), with the step and config of the run that wrote it. A checkpoint of an external HF
    model (a veRL run of ``policy.path`` or ``backend.verl.model_path``) is merged into an HF directory and
    generated from with the job environment's vLLM (``python``: its interpreter; :mod:`exgrpo.evaluation.hf_eval`)."""
    spec = spec or run_benchmarks(path)
    subsets = {r.name: r.n for r in parse_spec(spec) if r.n is not None}
    found = None if isinstance(path, CheckpointPolicy) else hf_checkpoint(Path(path))
    if found is not None:
        from exgrpo.evaluation.hf_eval import evaluate_hf, job_python

        cfg = ExperimentConfig.model_validate_json(found.config)
        interpreter = job_python(cfg, python)  # before any work: no vLLM is one line
        return Evaluation(evaluate_hf(found, spec, settings, interpreter, workers, log=log), found.step, cfg,
                          settings, subsets)
    loaded = path if isinstance(path, CheckpointPolicy) else load_checkpoint_policy(path)
    return Evaluation(_evaluate_policy(loaded, spec, settings, workers), loaded.step, loaded.config, settings, subsets)


def _evaluate_policy(loaded: CheckpointPolicy, spec: str, settings: EvalSettings, workers: int) -> list[Score]:
    """Scores of a loaded policy, on the run's thread count (float sums follow it, as in the run's own
    evaluation); the process's thread count is the caller's again afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(loaded.config.train.threads)
    try:
        return _score_policy(loaded, spec, settings, workers)
    finally:
        torch.set_num_threads(threads)


def _score_policy(loaded: CheckpointPolicy, spec: str, settings: EvalSettings, workers: int) -> list[Score]:
    cfg, task, policy = loaded.config, loaded.task, loaded.policy
    is_lm = not isinstance(cfg.policy, MLPPolicyConfig)
    max_tokens = settings.max_tokens or policy.max_response_length
    asked = parse_spec(spec)
    requests = [r for r in asked if r.name not in RUN_SPLITS]
    if requests and not is_lm:
        raise ValueError(f"benchmarks {[r.name for r in requests]} need an LM policy; tier {cfg.tier.value} only has "
                         f"{' and '.join(RUN_SPLITS)}")
    # every subset drawn before any is scored: one too large is one line, not the end of a long evaluation
    splits = {r.name: take_subset(list(task.val_ids) if r.name == "val" else train_probe(task), r.name, r.n,
                                  settings.seed, SPLIT_NAMES[r.name])
              for r in sorted((r for r in asked if r.name in RUN_SPLITS), key=lambda r: RUN_SPLITS.index(r.name))}
    chosen = [(req, bench, bench.subset(req.n, seed=settings.seed))
              for req, bench in ((r, get_benchmark(r.name)) for r in requests)]
    scores: list[Score] = []
    template = _text_codec(task)[2] if is_lm else "features"
    for split, ids in splits.items():
        rows = _sample(policy, task.prompts(ids), settings, max_tokens)
        correct = np.stack([task.rewards(ids, t, m).numpy() for t, m in rows], axis=1)
        scores += scores_of(split, correct, settings, max_tokens, template, f"{cfg.task.kind}-exact", "builtin")
    if chosen:
        encode, decode, template = _text_codec(task)
        with MathVerifier(workers=workers) as math_verifier:
            for req, bench, problems in chosen:
                prompts = [list(encode(p.prompt)) for p in problems]
                rows = _sample(policy, prompts, settings, max_tokens)
                golds = [p.gold for p in problems]
                if bench.answer_type == AnswerType.MULTIPLE_CHOICE:  # graded by the option letter
                    grader: Any = LetterGrader()
                    grade = partial(grader.score, labels=[p.meta.get("labels", "ABCD") for p in problems])
                else:
                    grader = math_verifier
                    grade = grader.score
                cols = []
                for tokens, mask in rows:
                    texts = [decode(r[m].tolist()) for r, m in zip(tokens, mask.bool(), strict=True)]
                    cols.append(np.array(grade(texts, golds).rewards))
                scores += scores_of(req.name, np.stack(cols, axis=1), settings, max_tokens, template,
                                  grader.grader_name, grader.grader_version)
    return scores


def format_scores(scores: list[Score]) -> str:
    lines = ["| benchmark | metric | value | problems | samples | temperature | top_p | max_tokens | template | grader |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in scores:
        lines.append(f"| {s.benchmark} | {s.metric} | {s.value:.4f} | {s.n_problems} | {s.n_samples} | "
                     f"{s.temperature} | {s.top_p} | {s.max_tokens} | {s.template} | {s.grader} {s.grader_version} |")
    return "\n".join(lines)
