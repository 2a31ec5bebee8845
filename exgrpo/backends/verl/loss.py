"""The ExGRPO loss on veRL's actor.

veRL 0.9.1's ``workers/utils/losses.ppo_loss`` passes only veRL's own fields to a registered loss (the
native trainer's way in: :mod:`exgrpo.backends.native.policy_loss`), so the off-policy mask would never
arrive. The veRL backend therefore installs :func:`exgrpo_actor_loss` on the actor
(``actor_rollout_wg.set_loss_fn`` after ``init_workers``). It reads the per-row ``exgrpo_off_policy``
and ``exgrpo_clip_on_policy`` fields the driver adds, computes the same per-token terms as the native
backend (:func:`exgrpo.core.loss.exgrpo_token_loss`) and aggregates them with veRL's ``agg_loss`` over
the *global* batch counts, because veRL sums the micro-batch losses.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch


from exgrpo.core.loss import (
    MixedLossConfig,
    exgrpo_token_loss,
    low_var_kl_per_token,
    token_loss_sums,
)

SUMS_PREFIX = "exgrpo_sums/"
"""Prefix of the additive loss statistics the actor returns (turned into ``actor/`` means on the driver)."""
OFF_POLICY_FIELD = "exgrpo_off_policy"
"""(N,) float 0/1 per row: 1 on replayed rows (the stored trajectory of a replayed question)."""
CLIP_FIELD = "exgrpo_clip_on_policy"
"""(N,) float 0/1 per row: 1 while on-policy tokens are PPO-clipped (before the mixed phase)."""


@dataclass(frozen=True)
class ActorLossSettings:
    """What the actor-side loss needs beyond the batch (picklable: Ray ships it to every worker)."""

    loss: MixedLossConfig
    loss_agg_mode: str
    """veRL's loss_agg_mode (``overrides.VERL_LOSS_AGG``)."""
    entropy_coeff: float
    kl_coeff: float = 0.0
    """Weight of the k3 KL toward the behaviour policy (``old_log_probs``), as in the native backend's
    :func:`exgrpo.core.loss.exgrpo_objective`; veRL's own reference-model KL is not used."""
    loss_scale_factor: float | None = None


def exgrpo_actor_loss(settings: ActorLossSettings, model_output: Any, data: Any, dp_group: Any = None):
    """veRL actor loss: ExGRPO's mixed policy loss minus the entropy bonus plus ``kl_coeff`` times the
    KL toward the behaviour policy, aggregated over the global batch. ``model_output["log_probs"]`` is the current policy (no padding); ``data`` holds
    the micro-batch with ``old_log_probs`` (behaviour log-probs on replayed rows), ``advantages``,
    ``response_mask`` and the two per-row exgrpo fields."""
    from verl.trainer.ppo.core_algos import agg_loss
    from verl.utils.metric.utils import AggregationType, Metric
    from verl.workers.utils.padding import no_padding_2_padding

    log_prob = no_padding_2_padding(model_output["log_probs"], data)  # (B, T)
    entropy = model_output.get("entropy", None)
    if entropy is not None:
        entropy = no_padding_2_padding(entropy, data)
    global_info = {
        "dp_size": data["dp_size"], "batch_num_tokens": data["batch_num_tokens"],
        "global_batch_size": data["global_batch_size"], "loss_scale_factor": settings.loss_scale_factor,
    }
    off_rows = data[OFF_POLICY_FIELD]
    clip_rows = data[CLIP_FIELD]
    fields = data.select("response_mask", "old_log_probs", "advantages").to_padded_tensor()
    mask = fields["response_mask"].to(bool)  # (B, T)
    off = off_rows.to(mask.device).bool().reshape(-1, 1) & mask  # (B, T)
    cfg = replace(settings.loss, clip_on_policy=bool(clip_rows.reshape(-1)[0] > 0))

    terms = exgrpo_token_loss(fields["old_log_probs"], log_prob, fields["advantages"], mask, off, cfg)
    pg_loss = agg_loss(terms.per_token, mask, settings.loss_agg_mode, **global_info)
    # additive sums (SUM over micro-batches; the driver divides: trainer.loss_metrics_from_sums)
    metrics = {f"{SUMS_PREFIX}{k}": Metric(value=v, aggregation=AggregationType.SUM)
               for k, v in token_loss_sums(terms, cfg).items()}
    with torch.no_grad():
        if terms.off.any():
            metrics["actor/off_ratio_max"] = Metric(value=float(terms.ratio[terms.off].max()), aggregation=AggregationType.MAX)
            metrics["actor/off_ratio_min"] = Metric(value=float(terms.ratio[terms.off].min()), aggregation=AggregationType.MIN)
        if terms.on.any():
            metrics["actor/on_ratio_max"] = Metric(value=float(terms.ratio[terms.on].max()), aggregation=AggregationType.MAX)
    metrics["actor/pg_loss"] = Metric(value=pg_loss.detach(), aggregation=AggregationType.SUM)
    # the entropy bonus and the KL are token means whatever loss_agg_mode the policy loss takes, as in
    # the reference and the native backend (exgrpo.core.loss.exgrpo_objective): a coefficient then
    # weighs what it weighs there
    loss = pg_loss
    if entropy is not None and settings.entropy_coeff:
        entropy_term = agg_loss(entropy, mask, "token-mean", **global_info)
        loss = loss - settings.entropy_coeff * entropy_term
        metrics["actor/entropy_loss"] = Metric(value=entropy_term.detach(), aggregation=AggregationType.SUM)
    if settings.kl_coeff:  # toward the behaviour policy, k3, as the native backend's low_var_kl
        kl = low_var_kl_per_token(log_prob, fields["old_log_probs"])
        kl_term = agg_loss(kl, mask, "token-mean", **global_info)
        loss = loss + settings.kl_coeff * kl_term
        metrics["actor/kl_loss"] = Metric(value=kl_term.detach(), aggregation=AggregationType.SUM)
    return loss, metrics


__all__ = ["ActorLossSettings", "CLIP_FIELD", "OFF_POLICY_FIELD", "exgrpo_actor_loss"]
