"""ExGRPO on veRL 0.9.1's v0 ``RayPPOTrainer``: a thin adapter around :mod:`exgrpo.core.replay`.

The step is veRL's own ``fit``; the replay core enters through five hooks, in step order:

1. :class:`ReplaySampler` is the train sampler. When veRL asks for a step's B questions it runs
   ``strategy.plan`` / ``strategy.select`` (current-policy entropies of the stored trajectories come
   from the actor's ``compute_log_prob``) and yields the replayed questions first, then fresh ones
   from :class:`exgrpo.core.fresh.FreshSampler`.
2. :class:`MixingRollout` wraps the rollout manager: the engine samples K-1 rows of a replayed
   question and K of a fresh one (:func:`generation_layout`), and row 0 of every replayed group
   becomes the stored trajectory (token ids, reward 1, and as
   ``rollout_log_probs`` the log-probs the strategy chose to play pi_old: the stored behaviour ones,
   or the current policy's without IS correction), and the per-row ``exgrpo_off_policy`` flag is set.
3. ``_compute_old_log_prob`` puts those log-probs back on replayed rows after veRL recomputes old
   log-probs, and keeps the entropies for the pool.
4. ``_update_actor`` hands the rewarded groups to ``strategy.observe`` (by question), sets the
   clipping flag from ``strategy.loss_config``, updates the actor with the ExGRPO loss installed
   by ``init_workers`` (:func:`exgrpo.backends.verl.loss.exgrpo_actor_loss`), returns pool metrics,
   and runs ``strategy.after_step``.
5. ``_save_checkpoint`` / ``_load_checkpoint`` write and read ``global_step_N/exgrpo_pool.pt``
   (:mod:`exgrpo.backends.verl.checkpoints`: torn steps skipped on resume, ``train.keep_last``).
"""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler
from verl import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from exgrpo.atomic import torch_save_atomic
from exgrpo.backends.verl.checkpoints import POOL_FILE, hold_after_checkpoint, prune, repair_tracker
from exgrpo.backends.verl.live import FILE_LOGGER_ENV
from exgrpo.backends.verl.loss import CLIP_FIELD, OFF_POLICY_FIELD, SUMS_PREFIX, ActorLossSettings, exgrpo_actor_loss
from exgrpo.backends.verl.overrides import VERL_LOSS_AGG
from exgrpo.config import ExperimentConfig
from exgrpo.core.batch import Replays, StepBatch, batch_metrics
from exgrpo.core.fresh import FreshSampler
from exgrpo.core.loss import metrics_from_sums
from exgrpo.core.replay import ReplayStrategy, make_replay_strategy
from exgrpo.runs import resumed_line

"""The replay state beside veRL's own checkpoint: ``global_step_N/exgrpo_pool.pt``."""


class ReplaySampler(Sampler[int]):
    """veRL's train sampler: per step, the replayed questions (dataset rows) first, then fresh ones.

    Stateful for torchdata's StatefulDataLoader (it restores ``steps_done`` instead of
    fast-forwarding through the sampler, which would replay selections)."""

    def __init__(self, n_rows: int, batch_size: int, strategy: ReplayStrategy, fresh: FreshSampler) -> None:
        self.n_rows, self.batch_size = n_rows, batch_size
        self.strategy, self.fresh = strategy, fresh
        self.steps_per_epoch = n_rows // batch_size
        self.steps_done = 0
        self.pending: list[Replays] = []
        """Replays picked for steps whose rollout has not happened yet (FIFO)."""
        self.score = None
        """(rows, tokens, mask) -> (log_prob, entropy) under the current policy; set by the trainer."""

    def __len__(self) -> int:
        return self.steps_per_epoch * self.batch_size

    def __iter__(self):
        if self.steps_done >= self.steps_per_epoch:
            self.steps_done = 0
        while self.steps_done < self.steps_per_epoch:
            n = self.strategy.plan(self.batch_size)
            replays = self.strategy.select(n, self.score)
            fresh = self.fresh.next(self.strategy.fresh_count(self.batch_size, len(replays)), self.strategy.retired)
            self.pending.append(replays)
            self.steps_done += 1
            yield from list(replays.qids) + list(fresh)

    def state_dict(self) -> dict[str, Any]:
        return {"steps_done": self.steps_done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps_done = int(state["steps_done"])


def response_rows(prompts: list[list[int]], responses: list[list[int]], pad_id: int, prompt_len: int,
                  response_len: int) -> dict[str, torch.Tensor]:
    """veRL's padded layout for given (prompt, response) token lists: prompts left-padded to
    ``prompt_len``, responses right-padded to ``response_len``. Shapes (N, P), (N, T), (N, P+T)."""
    n = len(prompts)
    p_ids = torch.full((n, prompt_len), pad_id, dtype=torch.long)
    r_ids = torch.full((n, response_len), pad_id, dtype=torch.long)
    attn = torch.zeros((n, prompt_len + response_len), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        p, r = p[-prompt_len:], r[:response_len]
        p_ids[i, prompt_len - len(p):] = torch.tensor(p, dtype=torch.long)
        r_ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        attn[i, prompt_len - len(p): prompt_len + len(r)] = 1
    position_ids = (attn.cumsum(-1) - 1).clamp_min(0)
    return {
        "prompts": p_ids, "responses": r_ids, "input_ids": torch.cat([p_ids, r_ids], dim=1),
        "attention_mask": attn, "position_ids": position_ids, "response_mask": attn[:, prompt_len:].clone(),
    }


def generation_layout(n_rows: int, k: int, n_replayed: int, n_chunks: int = 1) -> tuple[list[int], list[int]]:
    """Which rows of veRL's repeated generation batch (``n_rows`` = B*K, group g in rows g*K..g*K+K-1,
    replayed groups first) the rollout engine samples, and how its output fills the B*K layout again.

    Row 0 of a replayed group is the stored trajectory's slot, so it is not sampled: the engine gets
    K-1 rows of a replayed question and K of a fresh one. veRL splits the engine's batch evenly over
    ``n_chunks`` agent-loop workers, so only a multiple of ``n_chunks`` slots is skipped (the rest are
    sampled and overwritten, as before). Returns ``(sampled, fill)``: the rows to sample, and for every
    row of the full layout its position in the engine's output (a skipped slot takes its group's row 1,
    same question; :meth:`ExGRPORayTrainer.mix_in` then writes the stored trajectory over it)."""
    skip = n_replayed - n_replayed % n_chunks
    skipped = {g * k for g in range(skip)}
    sampled = [i for i in range(n_rows) if i not in skipped]
    position = {row: j for j, row in enumerate(sampled)}
    fill = [position[i + 1] if i in skipped else position[i] for i in range(n_rows)]
    return sampled, fill


class MixingRollout:
    """The rollout manager with replay mixed in (everything else is delegated to veRL's manager)."""

    def __init__(self, inner: Any, trainer: ExGRPORayTrainer) -> None:
        self._inner, self._trainer = inner, trainer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def generate_sequences(self, gen_batch: DataProto) -> DataProto:
        if gen_batch.meta_info.get("validate", False):
            return self._inner.generate_sequences(gen_batch)
        replays = self._trainer.sampler.pending.pop(0)
        rows = _rows(gen_batch)
        chunks = len(getattr(self._inner, "agent_loop_workers", None) or [None])
        sampled, fill = generation_layout(len(gen_batch), self._trainer.exgrpo.algorithm.group_size,
                                          len(replays), chunks)
        if len(sampled) < len(gen_batch):
            out = self._inner.generate_sequences(gen_batch.select_idxs(sampled)).select_idxs(fill)
        else:
            out = self._inner.generate_sequences(gen_batch)
        self._trainer.generated_rows = len(sampled)
        return self._trainer.mix_in(out, replays, rows)


class ExGRPORayTrainer(RayPPOTrainer):
    """veRL's v0 trainer with the ExGRPO replay core (pinned to veRL 0.9.1; see the module doc)."""

    def __init__(self, *args: Any, exgrpo_cfg: ExperimentConfig, **kwargs: Any) -> None:
        self.exgrpo = exgrpo_cfg
        algo = exgrpo_cfg.algorithm
        self.rng = np.random.default_rng(exgrpo_cfg.seed)
        self.strategy = make_replay_strategy(algo, self.rng)
        n_rows = len(kwargs["train_dataset"])
        self.fresh = FreshSampler(list(range(n_rows)), np.random.default_rng(exgrpo_cfg.seed + 1))
        self.sampler = ReplaySampler(n_rows, exgrpo_cfg.train.batch_size, self.strategy, self.fresh)
        self.sampler.score = self._score_stored
        kwargs["train_sampler"] = self.sampler
        super().__init__(*args, **kwargs)
        self._entropy: torch.Tensor | None = None
        self._picked: list[int] = []
        self.generated_rows = 0
        """Rows the rollout engine sampled this step (the stored trajectories' slots are skipped)."""

    # ---------------------------------------------------------------- set-up
    def init_workers(self) -> None:
        super().init_workers()
        algo, cfg = self.exgrpo.algorithm, self.exgrpo
        settings = ActorLossSettings(
            loss=self.strategy.loss_config(cfg.policy.max_new_tokens),
            loss_agg_mode=VERL_LOSS_AGG[algo.loss_agg], entropy_coeff=algo.entropy_coeff, kl_coeff=algo.kl_coeff,
            loss_scale_factor=cfg.policy.max_new_tokens,
        )
        self.actor_rollout_wg.set_loss_fn(partial(exgrpo_actor_loss, settings))
        self.async_rollout_manager = MixingRollout(self.async_rollout_manager, self)

    # ---------------------------------------------------------------- 1. selection scores
    def _prompt_ids(self, rows: list[int]) -> list[list[int]]:
        out = []
        for r in rows:
            item = self.train_dataset[int(r)]
            msgs = item["raw_prompt"] if "raw_prompt" in item else item["prompt"]
            ids = self.tokenizer.apply_chat_template(list(msgs), add_generation_prompt=True, tokenize=True)
            if hasattr(ids, "keys"):
                ids = ids["input_ids"]
            out.append([int(i) for i in ids])
        return out

    @torch.no_grad()
    def _score_stored(self, rows: list[int], tokens: torch.Tensor, mask: torch.Tensor):
        """Current-policy log-probs and entropies of stored responses, from the actor's forward."""
        data = self.config.data
        responses = [tokens[i][mask[i]].tolist() for i in range(tokens.shape[0])]
        fields = response_rows(self._prompt_ids(rows), responses, self.tokenizer.pad_token_id,
                               data.max_prompt_length, data.max_response_length)
        n = len(rows)
        unit = self.actor_rollout_wg.world_size * int(self.config.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu)
        pad = (-n) % unit
        if pad:  # veRL splits the batch evenly over workers and micro-batches
            fields = {k: torch.cat([v, v[-1:].expand(pad, *v.shape[1:])]) for k, v in fields.items()}
        meta = {"temperature": self.config.actor_rollout_ref.rollout.temperature,
                "global_token_num": fields["attention_mask"].sum(-1).tolist(), "images_seqlens": []}
        out, _ = self._compute_old_log_prob(DataProto.from_dict(tensors=fields, meta_info=meta), restore=False)
        t = tokens.shape[1]
        return out.batch["old_log_probs"][:n, :t].float(), out.batch["entropys"][:n, :t].float()

    # ---------------------------------------------------------------- 2. rollout mixing
    def mix_in(self, out: DataProto, replays: Replays, rows_field: list[int]) -> DataProto:
        """Replace row 0 of each replayed group with its stored trajectory; flag off-policy rows.
        ``rows_field``: the dataset row of every generated row (the generation batch's order)."""
        k = self.exgrpo.algorithm.group_size
        n = len(out)
        off = torch.zeros(n, dtype=torch.float32)
        b = out.batch
        p = b["prompts"].shape[1]
        t_max = b["responses"].shape[1]
        for g, (q, traj) in enumerate(zip(replays.qids, replays.trajectories, strict=True)):
            r = g * k
            if rows_field[r] != q:
                raise RuntimeError(f"replay layout: row {r} holds question {rows_field[r]}, expected {q}")
            tok = list(traj.tokens)[:t_max]
            length = len(tok)
            b["responses"][r] = self.tokenizer.pad_token_id
            b["responses"][r, :length] = torch.tensor(tok)
            b["input_ids"][r, p:] = b["responses"][r]
            b["attention_mask"][r, p:] = 0
            b["attention_mask"][r, p: p + length] = 1
            if "response_mask" in b.keys():
                b["response_mask"][r] = b["attention_mask"][r, p:]
            last = int(b["position_ids"][r, p - 1])
            b["position_ids"][r, p:] = last + 1 + torch.arange(t_max)
            behaviour = torch.zeros(t_max)
            behaviour[:length] = replays.old_log_prob[g, :length]  # pi_old as the strategy chose it
            b["rollout_log_probs"][r] = behaviour.to(b["rollout_log_probs"].dtype)
            if "rm_scores" in b.keys():  # a stored trajectory is correct: reward 1 on its last token
                b["rm_scores"][r] = 0.0
                b["rm_scores"][r, length - 1] = 1.0
            off[r] = 1.0
        out.batch[OFF_POLICY_FIELD] = off
        self._picked = list(replays.buckets)
        return out

    # ---------------------------------------------------------------- 3. old log-probs
    def _compute_old_log_prob(self, batch: DataProto, restore: bool = True):
        old, mfu = super()._compute_old_log_prob(batch)
        if not restore:
            return old, mfu
        self._entropy = old.batch["entropys"].detach().clone()
        if OFF_POLICY_FIELD in batch.batch.keys():
            off = batch.batch[OFF_POLICY_FIELD].bool()
            if off.any():
                old.batch["old_log_probs"][off] = batch.batch["rollout_log_probs"][off].float()
        return old, mfu

    # ---------------------------------------------------------------- 4. pool update + actor update
    def _update_actor(self, batch: DataProto) -> DataProto:
        k = self.exgrpo.algorithm.group_size
        step_batch, rewards = self._core_batch(batch, k)
        self.strategy.observe(step_batch, rewards, self.global_steps)
        n = len(batch)
        clip = self.strategy.loss_config(self.exgrpo.policy.max_new_tokens).clip_on_policy
        batch.batch[CLIP_FIELD] = torch.full((n,), float(clip))
        if OFF_POLICY_FIELD not in batch.batch.keys():
            batch.batch[OFF_POLICY_FIELD] = torch.zeros(n)
        out = super()._update_actor(batch)
        metrics = out.meta_info["metrics"]
        metrics.update(_loss_metrics(metrics))
        metrics.update(batch_metrics(rewards, step_batch))
        metrics["rollout/generated_rows"] = float(self.generated_rows)
        if self._picked:
            metrics["replay/picked_bucket_mean"] = float(np.mean(self._picked))
        metrics.update(self.strategy.stats())
        self.strategy.after_step(float(rewards.mean()), self.global_steps)
        self._picked = []
        return out

    def _core_batch(self, batch: DataProto, k: int) -> tuple[StepBatch, torch.Tensor]:
        """The step's rows as the core sees them (group-major, by veRL's uid); rewards (G, K)."""
        uids = batch.non_tensor_batch["uid"]
        n = len(uids)
        if n % k or any(uids[i] != uids[i - i % k] for i in range(n)):
            raise RuntimeError("veRL batch is not group-major (set trainer.balance_batch=False)")
        b = batch.batch
        rows = _rows(batch)
        mask = b["response_mask"].bool()
        rewards = b["token_level_scores"].sum(-1).float().view(-1, k)  # (G, K)
        off = b[OFF_POLICY_FIELD].bool() if OFF_POLICY_FIELD in b.keys() else torch.zeros(n, dtype=torch.bool)
        entropy = self._entropy if self._entropy is not None else torch.zeros_like(mask, dtype=torch.float32)
        step_batch = StepBatch(
            group_qids=[rows[g * k] for g in range(n // k)], row_qids=rows, tokens=b["responses"], mask=mask,
            old_log_prob=b["rollout_log_probs"].float(), behaviour_entropy=entropy, off_policy=off,
            n_replayed=int(off.sum()),
        )
        return step_batch, rewards

    # ---------------------------------------------------------------- 5. checkpoints
    def _pool_path(self, step: int) -> Path:
        return Path(self.config.trainer.default_local_dir) / f"global_step_{step}" / POOL_FILE

    def _save_checkpoint(self) -> None:
        """The pool first, then veRL's weights, data state and tracker (written last: a tracker that
        names step N means N is whole); then only the newest ``train.keep_last`` steps stay."""
        path = self._pool_path(self.global_steps)
        state = {
            "step": int(self.global_steps),
            "replay": self.strategy.state_dict(),
            "fresh": self.fresh.state_dict(),
            "rng": {"numpy": json.dumps(self.rng.bit_generator.state),
                    "numpy_fresh": json.dumps(self.fresh.rng.bit_generator.state)},
            "config": self.exgrpo.model_dump_json(),
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        torch_save_atomic(state, path)
        super()._save_checkpoint()
        self.prune_checkpoints()
        hold_after_checkpoint(self.global_steps)

    def _metrics_dir(self) -> Path | None:
        """veRL's metric logs of every attempt (the file logger's directory): a checkpoint whose step
        has no row there is not resumed from (:mod:`exgrpo.backends.verl.checkpoints`)."""
        path = os.environ.get(FILE_LOGGER_ENV)
        return Path(path).parent if path else None

    def prune_checkpoints(self) -> None:
        """Only the newest ``train.keep_last`` logged steps stay (and the one just saved): called after
        each save, and once the run's last row is written."""
        prune(Path(self.config.trainer.default_local_dir), self.exgrpo.train.keep_last, self.global_steps,
              self._metrics_dir())

    def ended_at(self) -> int | None:
        """The step a resumed run already ended at (its newest intact checkpoint at or past the last
        step), else None. veRL's ``fit`` counts on from the checkpoint's step + 1 and checks the budget
        after training a step, so it would train one step past the end of a finished run."""
        if self.config.trainer.resume_mode != "auto":
            return None
        step = repair_tracker(Path(self.config.trainer.default_local_dir), metrics_dir=self._metrics_dir())
        return step if step is not None and step >= self.total_training_steps else None

    def _load_checkpoint(self):
        if self.config.trainer.resume_mode == "auto":  # a torn or unlogged newest step is skipped, with a note
            repair_tracker(Path(self.config.trainer.default_local_dir), metrics_dir=self._metrics_dir())
        result = super()._load_checkpoint()
        if self.global_steps:
            path = self._pool_path(self.global_steps)
            if not path.is_file():
                raise FileNotFoundError(f"resume: {path} is missing; this checkpoint was not written by exgrpo")
            state = torch.load(path, map_location="cpu", weights_only=True)
            self.strategy.load_state_dict(state["replay"])
            self.fresh.load_state_dict(state["fresh"])
            self.rng.bit_generator.state = json.loads(state["rng"]["numpy"])
            self.fresh.rng.bit_generator.state = json.loads(state["rng"]["numpy_fresh"])

            print(f"exgrpo: {resumed_line(state['step'], self.strategy.stats(), path)}", flush=True)
        return result


def _loss_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """Pop the actor's additive loss sums (``actor/exgrpo_sums/...``) and return the token means."""
    prefix = "actor/" + SUMS_PREFIX
    sums = {k[len(prefix):]: float(np.sum(metrics.pop(k))) for k in list(metrics) if k.startswith(prefix)}
    return metrics_from_sums(sums) if sums else {}


def _rows(batch: DataProto) -> list[int]:
    """Dataset row of every batch row (``extra_info.index`` of our parquet files)."""
    infos = batch.non_tensor_batch["extra_info"]
    return [int(info["index"]) for info in infos]
