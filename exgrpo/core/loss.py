"""The mixed-policy objective of ExGRPO (exgrpo-spec.md §6), term by term.

Per response token t of sequence i, with r = exp(log_prob - old_log_prob):
- fresh (on-policy) tokens: the PPO clipped surrogate  max(-A r, -A clip(r, 1-eps, 1+eps)),
  or the unclipped -A r once replay has started (reference: ``loss_remove_clip``);
- replayed (off-policy) tokens, where old_log_prob is the *behaviour* log-prob stored in the pool:
  -A f(w), w = r, with f from :data:`SHAPINGS` (policy shaping w/(w+gamma) by default).
The total objective adds ``-entropy_coeff * H`` and ``+kl_coeff * KL`` (see :func:`exgrpo_objective`).

:func:`compute_exgrpo_policy_loss` has veRL's policy-loss signature (old_log_prob, log_prob,
advantages, response_mask, loss_agg_mode, config, rollout_is_weights) plus one keyword,
``off_policy_mask``; ``exgrpo.backends.native.policy_loss`` registers it in veRL's registry and the
native trainer calls it through that registry, so the CPU tests exercise the code the GPU trainer runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from exgrpo.config import LossAggregation, Shaping

# ----------------------------------------------------------------------------- shaping registry
ShapeFn = Callable[[torch.Tensor, "MixedLossConfig"], torch.Tensor]
"""(w (B,T), config) -> f(w) (B,T); gradients flow through w."""

SHAPINGS: dict[Shaping, ShapeFn] = {
    Shaping.IDENTITY: lambda w, cfg: w,
    Shaping.POLICY_SHAPING: lambda w, cfg: w / (w + cfg.shaping_gamma),
    Shaping.TRUNCATE: lambda w, cfg: torch.clamp(w, max=cfg.is_clip),
}


@dataclass(frozen=True)
class MixedLossConfig:
    """The loss's own options (built by the replay strategy, ``ReplayStrategy.loss_config``, from the
    algorithm config; see its field docs)."""

    clip_eps: float = 0.2
    clip_on_policy: bool = True
    shaping: Shaping = Shaping.POLICY_SHAPING
    shaping_gamma: float = 0.1
    is_clip: float = 2.0
    norm_length: int = 1
    """Constant L of the ``token-sum-norm`` aggregation (the max response length)."""


# ----------------------------------------------------------------------------- aggregation
def aggregate(loss: torch.Tensor, mask: torch.Tensor, mode: LossAggregation | str, norm_length: int = 1) -> torch.Tensor:
    """Reduce per-token ``loss`` (B,T) over ``mask`` (B,T) to a scalar."""
    m = mask.to(loss.dtype)
    mode = LossAggregation(mode)
    if mode == LossAggregation.TOKEN_MEAN:
        return (loss * m).sum() / m.sum().clamp_min(1.0)
    if mode == LossAggregation.TOKEN_SUM_NORM:
        return (loss * m).sum() / norm_length
    seq_has = m.sum(-1) > 0
    if mode == LossAggregation.SEQ_MEAN_TOKEN_SUM:
        per_seq = (loss * m).sum(-1)
    else:  # SEQ_MEAN_TOKEN_MEAN
        per_seq = (loss * m).sum(-1) / m.sum(-1).clamp_min(1.0)
    return per_seq[seq_has].mean() if seq_has.any() else loss.sum() * 0.0


def _masked_stat(x: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, float]:
    if not mask.any():
        return 0.0, 0.0, 0.0
    v = x[mask]
    return float(v.mean()), float(v.max()), float(v.min())


# ----------------------------------------------------------------------------- the policy loss
def compute_exgrpo_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = LossAggregation.TOKEN_MEAN.value,
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    off_policy_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Mixed on/off-policy policy-gradient loss.

    Args:
        old_log_prob: (B, T) log-probs of the policy that produced each token: the rollout policy
            for fresh tokens, the stored behaviour policy for replayed ones.
        log_prob: (B, T) log-probs under the current policy (with grad).
        advantages: (B, T) per-token advantages (a sequence's advantage broadcast over its tokens).
        response_mask: (B, T) bool/0-1, True on response tokens.
        loss_agg_mode: a :class:`LossAggregation` value.
        config: a :class:`MixedLossConfig` (or any object with ``exgrpo_loss`` holding one).
        rollout_is_weights: optional (B, T) extra per-token weights (veRL's rollout correction).
        off_policy_mask: (B, T) bool, True on replayed tokens; None means all tokens are fresh.

    Returns:
        (loss scalar, metrics) with MLflow-safe metric names under ``actor/``.
    """
    cfg = _resolve_config(config)
    terms = exgrpo_token_loss(old_log_prob, log_prob, advantages, response_mask, off_policy_mask, cfg)
    per_token = terms.per_token
    if rollout_is_weights is not None:
        per_token = per_token * rollout_is_weights
    loss = aggregate(per_token, terms.mask, loss_agg_mode, cfg.norm_length)
    metrics = {"actor/pg_loss": float(loss.detach()), **token_loss_metrics(terms, cfg, loss_agg_mode)}
    return loss, metrics


@dataclass
class TokenLoss:
    """The mixed objective's per-token terms, shapes (B, T)."""

    per_token: torch.Tensor
    """The loss of every token: ``off_loss`` on replayed tokens, ``on_loss`` on fresh ones."""
    on_loss: torch.Tensor
    """PPO surrogate (clipped unless clipping was dropped)."""
    off_loss: torch.Tensor
    """-A f(w) with the configured shaping."""
    ratio: torch.Tensor
    """w = exp(log_prob - old_log_prob), log-ratio clamped to [-20, 20]."""
    log_ratio: torch.Tensor
    on_clipfrac: torch.Tensor
    """bool, fresh tokens where the clipped branch was taken."""
    mask: torch.Tensor
    """bool, response tokens."""
    on: torch.Tensor
    """bool, fresh response tokens."""
    off: torch.Tensor
    """bool, replayed response tokens."""


def exgrpo_token_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    off_policy_mask: torch.Tensor | None,
    cfg: MixedLossConfig,
) -> TokenLoss:
    """Each term of the mixed loss per token (see :func:`compute_exgrpo_policy_loss` for the args)."""
    mask = response_mask.bool()
    off = torch.zeros_like(mask) if off_policy_mask is None else off_policy_mask.bool() & mask
    on = mask & ~off

    log_ratio = (log_prob - old_log_prob).clamp(-20.0, 20.0)  # (B,T)
    ratio = torch.exp(log_ratio)  # (B,T)

    # fresh tokens: PPO clipped surrogate (or plain -A r once clipping is dropped)
    on_unclipped = -advantages * ratio
    if cfg.clip_on_policy:
        on_clipped = -advantages * torch.clamp(ratio, 1.0 - cfg.clip_eps, 1.0 + cfg.clip_eps)
        on_loss = torch.maximum(on_unclipped, on_clipped)
        on_clipfrac = (on_clipped > on_unclipped) & on
    else:
        on_loss = on_unclipped
        on_clipfrac = torch.zeros_like(on)

    # replayed tokens: -A f(w), w = pi_theta / pi_behaviour
    off_loss = -advantages * SHAPINGS[Shaping(cfg.shaping)](ratio, cfg)

    per_token = torch.where(off, off_loss, on_loss)  # (B,T)
    return TokenLoss(per_token, on_loss, off_loss, ratio, log_ratio, on_clipfrac, mask, on, off)


def token_loss_metrics(t: TokenLoss, cfg: MixedLossConfig, loss_agg_mode: str) -> dict[str, float]:
    """Diagnostics of the mixed loss (MLflow-safe names under ``actor/``; METRICS.md)."""
    with torch.no_grad():
        on_mean, on_max, _ = _masked_stat(t.ratio, t.on)
        off_mean, off_max, off_min = _masked_stat(t.ratio, t.off)
        n_tok = t.mask.sum().clamp_min(1)
        on, off = t.on, t.off
        return {
            "actor/on_pg_loss": float(aggregate(t.on_loss, on, loss_agg_mode, cfg.norm_length)) if on.any() else 0.0,
            "actor/off_pg_loss": float(aggregate(t.off_loss, off, loss_agg_mode, cfg.norm_length)) if off.any() else 0.0,
            "actor/on_pg_clipfrac": float(t.on_clipfrac.sum() / on.sum().clamp_min(1)),
            "actor/ppo_kl": float(((-t.log_ratio) * on).sum() / on.sum().clamp_min(1)),
            "actor/on_ratio_mean": on_mean,
            "actor/on_ratio_max": on_max,
            "actor/off_ratio_mean": off_mean,
            "actor/off_ratio_max": off_max,
            "actor/off_ratio_min": off_min,
            "actor/off_ratio_above_is_clip": float(((t.ratio > cfg.is_clip) & off).sum() / off.sum().clamp_min(1)),
            "actor/off_token_fraction": float(off.sum() / n_tok),
        }


def token_loss_sums(t: TokenLoss, cfg: MixedLossConfig) -> dict[str, float]:
    """Additive statistics of the mixed loss (sums and token counts), for backends that split a
    batch over micro-batches and workers: add them up, then :func:`metrics_from_sums`."""
    with torch.no_grad():
        on, off = t.on, t.off
        return {
            "on_tokens": float(on.sum()), "off_tokens": float(off.sum()),
            "on_loss_sum": float((t.on_loss * on).sum()), "off_loss_sum": float((t.off_loss * off).sum()),
            "on_clipped": float(t.on_clipfrac.sum()), "on_neg_log_ratio_sum": float(((-t.log_ratio) * on).sum()),
            "on_ratio_sum": float((t.ratio * on).sum()), "off_ratio_sum": float((t.ratio * off).sum()),
            "off_above_is_clip": float(((t.ratio > cfg.is_clip) & off).sum()),
        }


def metrics_from_sums(s: dict[str, float]) -> dict[str, float]:
    """The ``actor/`` loss diagnostics (token means) from summed :func:`token_loss_sums`."""
    on, off = max(s["on_tokens"], 1.0), max(s["off_tokens"], 1.0)
    return {
        "actor/on_pg_loss": s["on_loss_sum"] / on,
        "actor/off_pg_loss": s["off_loss_sum"] / off if s["off_tokens"] else 0.0,
        "actor/on_pg_clipfrac": s["on_clipped"] / on,
        "actor/ppo_kl": s["on_neg_log_ratio_sum"] / on,
        "actor/on_ratio_mean": s["on_ratio_sum"] / on,
        "actor/off_ratio_mean": s["off_ratio_sum"] / off if s["off_tokens"] else 0.0,
        "actor/off_ratio_above_is_clip": s["off_above_is_clip"] / off,
        "actor/off_token_fraction": s["off_tokens"] / max(s["on_tokens"] + s["off_tokens"], 1.0),
    }


def _resolve_config(config: Any) -> MixedLossConfig:
    if config is None:
        return MixedLossConfig()
    if isinstance(config, MixedLossConfig):
        return config
    inner = getattr(config, "exgrpo_loss", None)
    if isinstance(inner, MixedLossConfig):
        return inner
    raise TypeError(
        f"config must be a MixedLossConfig or carry one as .exgrpo_loss, got {type(config).__name__}"
    )


# ----------------------------------------------------------------------------- full objective
def entropy_bonus(entropy: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Token-mean entropy over all response tokens, replayed ones included (reference)."""
    m = response_mask.to(entropy.dtype)
    return (entropy * m).sum() / m.sum().clamp_min(1.0)


def low_var_kl_per_token(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(pi_theta || pi_ref) per token: exp(ref - log_prob) - (ref - log_prob) - 1.
    Shapes (B, T) -> (B, T)."""
    d = (ref_log_prob - log_prob).clamp(-20.0, 20.0)
    return torch.exp(d) - d - 1.0


def low_var_kl(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Token mean of :func:`low_var_kl_per_token` over the response tokens."""
    kl = low_var_kl_per_token(log_prob, ref_log_prob)
    m = response_mask.to(kl.dtype)
    return (kl * m).sum() / m.sum().clamp_min(1.0)


PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]


def exgrpo_objective(
    policy_loss_fn: PolicyLossFn,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    off_policy_mask: torch.Tensor,
    loss_config: MixedLossConfig,
    loss_agg_mode: LossAggregation,
    entropy_coeff: float,
    kl_coeff: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """loss = pg_loss - entropy_coeff * H + kl_coeff * KL(pi_theta || pi_old). Shapes (B, T)."""
    pg_loss, metrics = policy_loss_fn(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode=LossAggregation(loss_agg_mode).value,
        config=loss_config,
        off_policy_mask=off_policy_mask,
    )
    entropy_term = entropy_bonus(entropy, response_mask)
    loss = pg_loss - entropy_coeff * entropy_term
    metrics["actor/entropy"] = float(entropy_term.detach())
    if kl_coeff > 0:
        kl = low_var_kl(log_prob, old_log_prob, response_mask)
        loss = loss + kl_coeff * kl
        metrics["actor/kl_loss"] = float(kl.detach())
    metrics["actor/loss"] = float(loss.detach())
    return loss, metrics


def notebook_off_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    is_clip: float,
    kl_beta: float,
    full_log_prob: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The notebook variant's replay term: -mean(w * log_prob) + kl_beta * KL(current || new).

    w = clamp(exp(log_prob - old_log_prob), 0, is_clip), detached. ``full_log_prob`` (B, T, V) are the
    current policy's log-probs over the whole vocabulary at each replayed position; the KL's
    "current" side is their detached copy (so, as in the notebook, the term has zero value and zero
    gradient at the first mini-batch of a step and only acts across later mini-batches).
    Shapes: (B, T) unless noted.
    """
    m = response_mask.to(log_prob.dtype)
    w = torch.clamp(torch.exp((log_prob - old_log_prob).clamp(-20.0, 20.0)), 0.0, is_clip).detach()
    pg = -(w * log_prob * m).sum() / m.sum().clamp_min(1.0)
    loss = pg
    metrics = {"notebook/off_pg_loss": float(pg.detach()), "notebook/off_w_mean": float((w * m).sum() / m.sum().clamp_min(1.0))}
    if full_log_prob is not None and kl_beta > 0:
        cur = full_log_prob.detach()
        kl_tok = (cur.exp() * (cur - full_log_prob)).sum(-1)  # (B,T)
        kl = (kl_tok * m).sum() / m.sum().clamp_min(1.0)
        loss = loss + kl_beta * kl
        metrics["notebook/off_kl"] = float(kl.detach())
    return loss, metrics
