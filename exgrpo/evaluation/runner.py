"""Evaluate a checkpoint on benchmarks: avg@n and pass@k, each score with its sampling settings.

``val`` is the run's own held-out split (graded by the task's reward); every other name comes from
the benchmark registry (graded by math-verify in a process pool, :class:`exgrpo.rewards.MathVerifier`).
LM policies only for registry benchmarks: a toy MLP reads feature vectors, not text.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from exgrpo.backends.base import build_policy, hf_checkpoint
from exgrpo.backends.base import read_checkpoint as backend_checkpoint
from exgrpo.config import ExperimentConfig, MLPPolicyConfig
from exgrpo.evaluation.benchmarks import AnswerType, get_benchmark, parse_benchmark_spec
from exgrpo.evaluation.metrics import Score, scores_of
from exgrpo.rewards import MathVerifier
from exgrpo.rewards.choice import LetterGrader


@dataclass(frozen=True)
class EvalSettings:
    """How responses are sampled for evaluation (recorded beside every score)."""

    n: int = 1
    """Samples per problem (avg@n; pass@k for k in 1, 2, 4, ... <= n)."""
    temperature: float = 0.0
    """0 means greedy decoding."""
    top_p: float = 1.0
    """Nucleus mass when sampling."""
    max_tokens: int | None = None
    """Response budget; None: the policy's max_new_tokens."""
    seed: int = 0
    """Seed of the problem subset and of sampling."""


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


def evaluate_as_in_training(checkpoint: str | Path | CheckpointPolicy) -> dict[str, float]:
    """The checkpoint's policy (a native step_*.pt, a veRL global_step_N/, or one already loaded)
    evaluated as the run evaluates (:func:`greedy_accuracy`, on the run's thread count and seed;
    ``exgrpo eval`` scores benchmarks with sampling settings). The process's torch thread count is
    the caller's again afterwards."""
    loaded = checkpoint if isinstance(checkpoint, CheckpointPolicy) else load_checkpoint_policy(checkpoint)
    threads = torch.get_num_threads()
    torch.set_num_threads(loaded.config.train.threads)  # as the run's trainer: float sums follow the thread count
    try:
        generator = torch.Generator().manual_seed(loaded.config.seed)
        return greedy_accuracy(loaded.task, loaded.policy, generator, train_probe(loaded.task))[0]
    finally:
        torch.set_num_threads(threads)


def as_in_training(path: str | Path, python: str | None = None) -> tuple[ExperimentConfig, int, dict[str, float]]:
    """(config, step, metrics) of a checkpoint evaluated as its run evaluates (:func:`evaluate_as_in_training`);
    an external HF model's: greedy accuracy on the run's validation split, generated by vLLM."""
    found = hf_checkpoint(Path(path))
    if found is None:
        loaded = load_checkpoint_policy(path)
        return loaded.config, loaded.step, evaluate_as_in_training(loaded)
    from exgrpo.evaluation.hf_eval import evaluate_hf, job_python

    cfg = ExperimentConfig.model_validate_json(found.config)
    (score,) = [s for s in evaluate_hf(found, "val", EvalSettings(), job_python(cfg, python)) if s.metric == "avg_at_1"]
    return cfg, found.step, {"val/accuracy": score.value}


def eval_names(metrics: dict[str, float]) -> dict[str, float]:
    """The evaluation's metrics under ``eval/``: ``val/accuracy`` -> ``eval/accuracy``,
    ``train/accuracy`` -> ``eval/train_accuracy``."""
    return {f"eval/{k.split('/', 1)[-1]}" if k.startswith("val/") else f"eval/{k.replace('/', '_')}": v
            for k, v in metrics.items()}


def _sample(policy, prompts: list, settings: EvalSettings, max_tokens: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """n rollouts per prompt row: list over samples of (tokens, mask)."""
    g = torch.Generator().manual_seed(settings.seed)
    greedy = settings.temperature == 0.0
    out = []
    with torch.no_grad():
        if hasattr(policy, "eos_id"):  # an LMPolicy: sample with this evaluation's settings
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


def score_checkpoint(path: str | Path, spec: str = "val", settings: EvalSettings = EvalSettings(),
                     workers: int = 2, python: str | None = None, log: Path | None = None) -> Evaluation:
    """:func:`evaluate_checkpoint` with the step and config. A checkpoint of an external HF model (a
    veRL run of ``policy.path`` or ``backend.verl.model_path``) is merged into an HF directory and generated from with the
    job environment's vLLM (``python``: its interpreter; :mod:`exgrpo.evaluation.hf_eval`)."""
    found = hf_checkpoint(Path(path))
    if found is not None:
        from exgrpo.evaluation.hf_eval import evaluate_hf, job_python

        cfg = ExperimentConfig.model_validate_json(found.config)
        interpreter = job_python(cfg, python)  # before any work: no vLLM is one line
        return Evaluation(evaluate_hf(found, spec, settings, interpreter, workers, log=log), found.step, cfg)
    loaded = load_checkpoint_policy(path)
    return Evaluation(_evaluate_policy(loaded, spec, settings, workers), loaded.step, loaded.config)


def evaluate_checkpoint(path: str | Path, spec: str = "val", settings: EvalSettings = EvalSettings(),
                        workers: int = 2, python: str | None = None) -> list[Score]:
    """Scores of a checkpoint on the benchmarks of ``spec`` (e.g. ``"val,arith:100,gsm8k:64"``)."""
    return score_checkpoint(path, spec, settings, workers, python).scores


def _evaluate_policy(loaded: CheckpointPolicy, spec: str, settings: EvalSettings, workers: int) -> list[Score]:
    cfg, task, policy = loaded.config, loaded.task, loaded.policy
    is_lm = not isinstance(cfg.policy, MLPPolicyConfig)
    max_tokens = settings.max_tokens or policy.max_response_length
    names = [s.strip() for s in spec.split(",") if s.strip()]
    registry = [n for n in names if n.split(":")[0] != "val"]
    requests = parse_benchmark_spec(",".join(registry)) if registry else []
    if requests and not is_lm:
        raise ValueError(f"benchmarks {[r.name for r in requests]} need an LM policy; tier {cfg.tier.value} only has 'val'")
    scores: list[Score] = []
    if any(n.split(":")[0] == "val" for n in names):
        ids = list(task.val_ids)
        rows = _sample(policy, task.prompts(ids), settings, max_tokens)
        correct = np.stack([task.rewards(ids, t, m).numpy() for t, m in rows], axis=1)
        template = _text_codec(task)[2] if is_lm else "features"
        scores += scores_of("val", correct, settings, max_tokens, template, f"{cfg.task.kind}-exact", "builtin")
    if requests:
        encode, decode, template = _text_codec(task)
        with MathVerifier(workers=workers) as math_verifier:
            for req in requests:
                bench = get_benchmark(req.name)
                problems = bench.subset(req.n, seed=settings.seed)
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
