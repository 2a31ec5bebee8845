"""The native trainer: one backend-agnostic step, run in a loop with evaluation and checkpoints.

Step (the order of :mod:`exgrpo.core.replay`): plan -> replayed questions and trajectories ->
rollouts -> mixed batch -> rewards -> the strategy observes the groups -> advantages -> loss
(through veRL's policy-loss registry) -> update -> metrics -> the strategy's schedules.

Determinism: all randomness flows from three generators saved in the checkpoint (torch sampling,
numpy replay/minibatch, torch init), so a killed run resumed from step n produces the same metrics
as an uninterrupted one, bit for bit on CPU at a fixed thread count.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from exgrpo.backends.base import MLflowRun, StepCallback, TrainResult
from exgrpo.backends.native import checkpoint as ckpt
from exgrpo.policies.build import build_task_and_policy
from exgrpo.policies.interfaces import Policy, Task
from exgrpo.policies.lm.precision import check_precision, check_weights_dtype
from exgrpo.backends.native.memory import bound_onednn_cache, keep_freed_memory, release_freed_memory
from exgrpo.backends.native.policy_loss import get_exgrpo_loss_fn
from exgrpo.core.fresh import FreshSampler
from exgrpo.config import (
    ExperimentConfig,
    OptimizerKind,
    Precision,
    TrainConfig,
)
from exgrpo.core.advantages import grpo_advantages
from exgrpo.core.batch import StepBatch, assemble_batch, batch_metrics, generation_qids, mini_batch_rows
from exgrpo.core.loss import exgrpo_objective
from exgrpo.core.replay import make_replay_strategy
from exgrpo.evaluation.runner import greedy_accuracy, train_probe
from exgrpo.progress import StepProgress
from exgrpo.runs import check_resume, read_metrics, refuse_earlier_run, resumed_line, write_metrics


PHASES = ("rollout", "old_log_prob", "reward", "forward", "backward", "replay", "replay_scoring")
"""Parts of a step timed as ``time/<phase>_seconds`` (METRICS.md)."""


class Trainer:
    """The native backend: the core's step (:mod:`exgrpo.core.replay`) on an in-process policy."""

    def __init__(
        self, cfg: ExperimentConfig, task: Task | None = None, policy: Policy | None = None, progress: bool = False
    ) -> None:
        self.cfg = cfg
        torch.set_num_threads(cfg.train.threads)
        check_precision(getattr(cfg.policy, "precision", Precision.FP32))  # before any work
        check_weights_dtype(getattr(cfg.policy, "dtype", "float32"))
        if getattr(cfg.policy, "rollout_precision", "fp32") == "bf16":  # decoded from bf16 weights, as dtype bfloat16 is
            check_weights_dtype("bfloat16", field="policy.rollout_precision", spelled=("bf16", "fp32"))
        if cfg.train.keep_freed_memory:
            keep_freed_memory()
        bound_onednn_cache()
        if task is None or policy is None:
            task, policy = build_task_and_policy(cfg, progress=progress)
        self.task, self.policy = task, policy
        algo, train = cfg.algorithm, cfg.train
        self.algo = algo
        params = list(policy.parameters())
        fused = {"fused": True} if train.fused_optimizer else {}
        if train.optimizer == OptimizerKind.ADAMW:
            self.optimizer = torch.optim.AdamW(params, lr=train.lr, weight_decay=train.weight_decay, **fused)
        else:
            self.optimizer = torch.optim.Adam(params, lr=train.lr, **fused)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.rng = np.random.default_rng(cfg.seed)
        self.fresh = FreshSampler(task.train_ids, np.random.default_rng(cfg.seed + 1))
        self.replay = make_replay_strategy(algo, self.rng)
        self.loss_fn = get_exgrpo_loss_fn()
        self.steps_per_epoch, self.total_steps = planned_steps(train, len(task.train_ids))
        total = train.epochs * self.steps_per_epoch
        if train.max_steps and train.max_steps > total:
            _say(f"train.max_steps={train.max_steps} is more than the {total} steps train.epochs={train.epochs} allow "
                 f"({self.steps_per_epoch} per epoch); the run stops at step {total} (raise train.epochs for more)")
        self.step = 0
        self.history: list[dict[str, float]] = []
        self._seconds: dict[str, float] = {}  # wall time per phase of the current step (time/<phase>_seconds)
        self.val_correct: list[float] = []  # the last evaluation's held-out reward per validation question

    # ------------------------------------------------------------------ the step
    @property
    def epoch(self) -> int:
        """0-based epoch of the next step."""
        return self.step // self.steps_per_epoch

    @contextlib.contextmanager
    def _timed(self, phase: str):
        """Add the block's wall time to this step's ``time/<phase>_seconds``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._seconds[phase] = self._seconds.get(phase, 0.0) + time.perf_counter() - t0

    @torch.no_grad()
    def _score_stored(self, qids: list[int], tokens: torch.Tensor, mask: torch.Tensor):
        with self._timed("replay_scoring"):
            scores = self.policy.score(self.task.prompts(qids), tokens, mask)
        return scores.log_prob, scores.entropy

    def train_step(self) -> dict[str, float]:
        cfg, k = self.cfg, self.algo.group_size
        t0 = time.perf_counter()
        self._seconds = {}

        # 1-3. plan, replayed questions and trajectories, fresh questions
        with self._timed("replay"):
            n_replay = self.replay.plan(cfg.train.batch_size)
            replays = self.replay.select(n_replay, self._score_stored)
            fresh_qids = self.fresh.next(self.replay.fresh_count(cfg.train.batch_size, len(replays)), self.replay.retired)

        # 4. rollouts: K-1 per replayed question, K per fresh one; the mixed batch
        with self._timed("rollout"), torch.no_grad():
            prompts = self.task.prompts(generation_qids(replays.qids, fresh_qids, k))
            ro = self.policy.generate(prompts, self.generator)
        with self._timed("old_log_prob"):  # pi_old from the training forward (no forward where the sampler is it)
            ro = self.policy.with_training_log_probs(prompts, ro)
        with self._timed("replay"):
            batch = assemble_batch(replays, fresh_qids, ro.tokens, ro.mask, ro.log_prob, ro.entropy, k)

        # 5. rewards; the strategy sees the groups (pool insert, retirement, bucket moves)
        with self._timed("reward"):
            rewards = self.task.rewards(batch.row_qids, batch.tokens, batch.mask).view(-1, k)  # (G, K)
        with self._timed("replay"):
            self.replay.observe(batch, rewards, self.step)

        # 6-8. advantages, loss, update
        adv = grpo_advantages(rewards, self.algo.advantage_std_norm).reshape(-1, 1).expand_as(batch.old_log_prob)
        metrics = self._update(batch, adv)

        metrics.update(batch_metrics(rewards, batch))
        metrics["train/epoch"] = float(self.epoch)
        if replays.buckets:
            metrics["replay/picked_bucket_mean"] = float(np.mean(replays.buckets))
        with self._timed("replay"):
            metrics.update(self.replay.stats())
            self.replay.after_step(float(rewards.mean()), self.step)
        seconds = dict(self._seconds)
        seconds["replay"] = seconds.get("replay", 0.0) - seconds.get("replay_scoring", 0.0)  # bookkeeping only
        for phase in PHASES:
            metrics[f"time/{phase}_seconds"] = seconds.get(phase, 0.0)
        metrics["time/step_seconds"] = time.perf_counter() - t0
        return metrics

    def _update(self, batch: StepBatch, adv: torch.Tensor) -> dict[str, float]:
        cfg, algo = self.cfg, self.algo
        loss_cfg = self.replay.loss_config(self.policy.max_response_length)
        aux = self.replay.auxiliary(self.epoch, self.step)
        chunks = mini_batch_rows(self.rng, batch.tokens.shape[0], algo.group_size, cfg.train.mini_batches,
                                 cfg.train.mini_batch_split)
        prompts = self.task.prompts(batch.row_qids)
        sums: dict[str, float] = {}
        for chunk in chunks:
            idx = torch.as_tensor(chunk, dtype=torch.long)
            mask = batch.mask[idx]
            with self._timed("forward"):
                scores = self.policy.score(prompts[idx] if torch.is_tensor(prompts) else [prompts[i] for i in chunk], batch.tokens[idx], mask)
            token_off = batch.off_policy[idx][:, None] & mask
            loss, m = exgrpo_objective(
                self.loss_fn, batch.old_log_prob[idx], scores.log_prob, scores.entropy, adv[idx], mask, token_off,
                loss_cfg, algo.loss_agg, algo.entropy_coeff, algo.kl_coeff,
            )
            if aux is not None:
                with self._timed("forward"):
                    aux_scores = self.policy.score(self.task.prompts(aux.qids), aux.tokens, aux.mask, full=aux.needs_full_log_prob)
                aux_loss, m_aux = aux.loss(aux_scores.log_prob, aux_scores.full_log_prob)
                loss = (1 - aux.weight) * loss + aux.weight * aux_loss
                m.update(m_aux)
            with self._timed("backward"):  # backward, clipping and the optimizer step
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = float(torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.train.grad_clip or math.inf))
                skip = cfg.train.skip_grad_above
                skipped = not math.isfinite(grad_norm) or (skip is not None and grad_norm > skip)
                if not skipped:
                    self.optimizer.step()
                # the gradients are read by nothing until the next backward: free them now, so that the
                # rollout, the evaluations and the checkpoint do not hold a second copy of the weights
                self.optimizer.zero_grad(set_to_none=True)
            m["actor/grad_norm"] = grad_norm
            m["actor/step_skipped"] = float(skipped)
            for key, v in m.items():
                sums[key] = sums.get(key, 0.0) + v / len(chunks)
        if aux is not None:  # the replay term's stored responses entered the loss once per mini-batch
            sums["compute/replay_term_tokens"] = float(aux.mask.sum()) * len(chunks)
        return sums

    # ------------------------------------------------------------------ evaluation
    def evaluate(self) -> dict[str, float]:
        """Greedy accuracy on the held-out questions and on a fixed sample of training questions
        (:func:`exgrpo.evaluation.runner.greedy_accuracy`)."""
        out, self.val_correct = greedy_accuracy(self.task, self.policy, self.generator, self._train_probe)
        return out

    def _evaluated(self, callbacks: list, step: int) -> None:
        for cb in callbacks:
            if hasattr(cb, "on_evaluation"):
                cb.on_evaluation(step, self.val_correct)

    @functools.cached_property
    def _train_probe(self) -> list[int]:
        """The training questions ``train/accuracy`` is measured on (drawn once)."""
        return train_probe(self.task)

    # ------------------------------------------------------------------ loop
    def fit(
        self,
        callbacks: list[StepCallback] | None = None,
        resume: bool = False,
        progress: bool = True,
        stop_after_step: int | None = None,
        force_resume: bool = False,
    ) -> TrainResult:
        """Train to ``total_steps``, or to the step whose sampled tokens reach ``train.max_sampled_tokens``.
        ``resume`` continues from the latest checkpoint in the run
        directory; ``stop_after_step`` ends early (after checkpointing) as if the run were killed."""
        run_dir = self.cfg.run_dir()
        if not resume:
            refuse_earlier_run(run_dir)  # a fresh run never mixes with an earlier run's checkpoints
        run_dir.mkdir(parents=True, exist_ok=True)
        metrics_path = run_dir / "metrics.jsonl"
        last_ckpt: Path | None = None  # the newest checkpoint of this run (a finished run resumed: the one it loaded)
        if resume:
            found = ckpt.load_latest_intact(run_dir, warn=_say)
            if found is None:
                raise ckpt.no_checkpoint_error(run_dir)
            last_ckpt, state = found
            history = read_metrics(metrics_path, up_to_step=int(state["step"]), warn=_say)
            check_resume_from(self.cfg, last_ckpt, state, sampled_tokens(history), force_resume, self.total_steps)
            self.load_state_dict(state)
            if progress:
                print(resumed_line(self.step, self.replay.stats(), last_ckpt), flush=True)
            self.history = history
            write_metrics(metrics_path, self.history)
        else:
            metrics_path.write_text("")
            (run_dir / "config.json").write_text(self.cfg.model_dump_json(indent=2))
        every = self.cfg.train.checkpoint_every
        eval_every = self.cfg.train.eval_every_steps or self.cfg.train.eval_every_epochs * self.steps_per_epoch
        budget = self.cfg.train.max_sampled_tokens or math.inf
        sampled = sampled_tokens(self.history)  # resumed runs count theirs
        callbacks = callbacks or []
        for cb in callbacks:
            if hasattr(cb, "on_start"):
                cb.on_start(self.total_steps)
        with StepProgress(self.total_steps, self.step, enabled=progress, title=self.cfg.name) as bar:
            if self.step == 0 and self.cfg.train.eval_before_train:
                m0 = {"step": 0.0, **self.evaluate()}
                self._evaluated(callbacks, 0)
                bar.epoch_summary(0, 0, m0)
                self.history.append(m0)
                with metrics_path.open("a") as f:
                    f.write(json.dumps(m0) + "\n")
                for cb in callbacks:
                    cb(0, m0)
            while self.step < self.total_steps and sampled < budget:
                m = self.train_step()
                self.step += 1
                m["step"] = float(self.step)
                sampled += m.get("compute/rollout_tokens", 0.0)
                last = self.step == self.total_steps or sampled >= budget
                if self.step % eval_every == 0 or last:
                    m.update(self.evaluate())
                    self._evaluated(callbacks, self.step)
                    bar.epoch_summary(self.step // self.steps_per_epoch, self.step, m)
                self.history.append(m)
                with metrics_path.open("a") as f:
                    f.write(json.dumps(m) + "\n")
                for cb in callbacks:
                    cb(self.step, m)
                bar.advance(m)
                if (every and self.step % every == 0) or last:
                    last_ckpt = ckpt.save(self, run_dir, finished=last)
                if stop_after_step is not None and self.step >= stop_after_step:
                    break
        final = dict(self.history[-1]) if self.history else {}
        if "val/accuracy" not in final:  # stopped early, between evaluations
            final.update(self.evaluate())
        return TrainResult(final, self.history, run_dir, last_ckpt, task=self.task, policy=self.policy)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "model": self.policy.state_dict(),
            ckpt.OPTIMIZER: self.optimizer.state_dict(),
            "replay": self.replay.state_dict(),
            "fresh": self.fresh.state_dict(),
            "rng": {
                "torch_sampling": self.generator.get_state(),
                "torch_global": torch.get_rng_state(),
                "numpy": _jsonable(self.rng.bit_generator.state),
                "numpy_fresh": _jsonable(self.fresh.rng.bit_generator.state),
            },
            "config": self.cfg.model_dump_json(),
            TRAIN_QUESTIONS: len(self.task.train_ids),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.policy.load_state_dict(state["model"])
        if ckpt.OPTIMIZER in state:  # absent only from a finished run's last checkpoint, which trains no further
            self.optimizer.load_state_dict(state[ckpt.OPTIMIZER])
        self.replay.load_state_dict(state["replay"] if "replay" in state else _legacy_replay_state(state))
        self.fresh.load_state_dict(state["fresh"])
        self.generator.set_state(state["rng"]["torch_sampling"])
        torch.set_rng_state(state["rng"]["torch_global"])
        self.rng.bit_generator.state = json.loads(state["rng"]["numpy"])
        self.fresh.rng.bit_generator.state = json.loads(state["rng"]["numpy_fresh"])


def _say(message: str) -> None:
    """A one-line note to the user (resume fall-backs), on stderr."""
    import sys

    print(f"note: {message}", file=sys.stderr)


def _legacy_replay_state(state: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint from before the replay core (pool/buffer/switch at the top level)."""
    return {key: state[key] for key in ("pool", "switch", "buffer") if key in state}


def _jsonable(state: dict) -> str:
    return json.dumps(state)


TRAIN_QUESTIONS = "train_questions"
"""A checkpoint's count of its run's training questions (what the run's planned steps follow from)."""


def planned_steps(train: TrainConfig, train_questions: int) -> tuple[int, int]:
    """``(steps per epoch, steps the run trains at most)`` of ``train`` over ``train_questions`` questions
    (a budget of sampled tokens may end it sooner)."""
    per_epoch = math.ceil(train_questions / train.batch_size)
    total = train.epochs * per_epoch
    return per_epoch, (min(total, train.max_steps) if train.max_steps else total)


def sampled_tokens(history: list[dict[str, float]]) -> float:
    """Response tokens a run's steps sampled (``compute/rollout_tokens``), over its metric records."""
    return sum(h.get("compute/rollout_tokens", 0.0) for h in history)


def check_resume_from(cfg: ExperimentConfig, path: Path, state: dict[str, Any], sampled: float,
                      force_resume: bool = False, total_steps: int | None = None) -> None:
    """Raise what a resume of ``cfg`` from checkpoint ``path`` (its ``state``; ``sampled``: the tokens its
    run had sampled by then) is refused with: a config that differs in what the run means (ResumeMismatch,
    unless ``force_resume``), or training past a finished run's last checkpoint kept without the
    optimiser's state (FinishedCheckpoint). ``total_steps``: the run's planned steps; by default from the
    checkpoint's count of training questions (left to the trainer, which counts the task's own, where the
    checkpoint has no count, written before it kept one, or where a forced resume may have changed the task)."""
    check_resume(state["config"], cfg.model_dump_json(), path, force=force_resume)
    if ckpt.OPTIMIZER in state:
        return
    if total_steps is None:
        if TRAIN_QUESTIONS not in state or force_resume:
            return
        total_steps = planned_steps(cfg.train, int(state[TRAIN_QUESTIONS]))[1]
    step = int(state["step"])
    if step < total_steps and sampled < (cfg.train.max_sampled_tokens or math.inf):
        raise ckpt.FinishedCheckpoint(
            f"--resume: {path} is a finished run's last checkpoint without the optimiser's state "
            f"(train.final_checkpoint_optimizer=false), so the run cannot train past step {step}; "
            "train longer in a new run (another name or --output-dir), or delete it to go on from the "
            "run's checkpoint before it where one is kept")


def train(cfg: ExperimentConfig, callbacks: list[StepCallback] | None = None, resume: bool = False,
          progress: bool = True, force_resume: bool = False) -> TrainResult:
    """Build and run a native trainer for ``cfg``; once it is gone, the heap it kept goes back to the system
    (the next run of this process starts from what is alive, not from this run's peak)."""
    try:
        return Trainer(cfg, progress=progress).fit(callbacks=callbacks, resume=resume, progress=progress,
                                                   force_resume=force_resume)
    finally:
        release_freed_memory()


class NativeBackend:
    """The in-process CPU backend (toy, tiny-lm and SmolLM2 tiers)."""

    name = "native"
    reports_to_mlflow = False
    """Steps reach MLflow through the caller's callbacks, in process, as they end."""

    def train(self, cfg: ExperimentConfig, callbacks: list[StepCallback] | None = None, resume: bool = False,
              progress: bool = True, force_resume: bool = False, mlflow_run: MLflowRun | None = None) -> TrainResult:
        return train(cfg, callbacks=callbacks, resume=resume, progress=progress, force_resume=force_resume)

    def check_resumable(self, cfg: ExperimentConfig, force_resume: bool = False) -> None:
        """What :meth:`train` with ``resume`` would refuse, raised before anything is built or recorded: the
        newest intact checkpoint's entries are read with its tensors mapped, not loaded. The notes of that
        reading (a torn checkpoint passed over, a torn metrics line) are given with a refusal only: a
        resume that goes on gives them as it reads the same files."""
        notes: list[str] = []
        try:
            found = ckpt.load_latest_intact(cfg.run_dir(), warn=notes.append, mmap=True)
            if found is None:
                raise ckpt.no_checkpoint_error(cfg.run_dir())
            path, state = found
            history = read_metrics(cfg.run_dir() / "metrics.jsonl", up_to_step=int(state["step"]), warn=notes.append)
            check_resume_from(cfg, path, state, sampled_tokens(history), force_resume)
        except Exception:
            for note in notes:
                _say(note)
            raise

    def read_checkpoint(self, path: Path) -> dict[str, Any] | None:
        """A ``step_*.pt`` file (:func:`exgrpo.backends.native.checkpoint.load_state`; CheckpointError
        if it is not one)."""
        return ckpt.load_state(path) if path.is_file() else None

    def policy_file(self, checkpoint: Path) -> Path | None:
        """A native checkpoint is one file already."""
        return checkpoint if checkpoint.is_file() else None

    def build_policy(self, cfg: ExperimentConfig) -> tuple[Task, Policy]:
        return build_task_and_policy(cfg)


NATIVE = NativeBackend()
