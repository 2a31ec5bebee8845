"""veRL's actor loss (:func:`exgrpo.backends.verl.loss.exgrpo_actor_loss`) on a hand-built micro-batch
in veRL's own layout: the terms beside the policy loss weigh what they weigh on the native backend."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("verl")

from tensordict import TensorDict  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402

from exgrpo.backends.verl.loss import CLIP_FIELD, OFF_POLICY_FIELD, ActorLossSettings, exgrpo_actor_loss  # noqa: E402
from exgrpo.core.loss import MixedLossConfig, entropy_bonus, low_var_kl_per_token  # noqa: E402

B, P, T = 4, 2, 5  # rows, prompt tokens, response tokens


def _micro_batch(response_mask: torch.Tensor, old_log_prob: torch.Tensor) -> TensorDict:
    """One micro-batch as veRL's actor hands it to a loss: padded fields, no attention padding, the
    global counts as non-tensor data (one data-parallel rank, so the micro-batch is the global batch)."""
    data = TensorDict({
        "prompts": torch.ones(B, P, dtype=torch.long), "responses": torch.ones(B, T, dtype=torch.long),
        "attention_mask": torch.ones(B, P + T, dtype=torch.long), "response_mask": response_mask,
        "old_log_probs": old_log_prob, "advantages": torch.zeros(B, T),
        OFF_POLICY_FIELD: torch.zeros(B), CLIP_FIELD: torch.ones(B),
    }, batch_size=[B])
    for key, value in {"dp_size": 1, "batch_num_tokens": int(response_mask.sum()), "global_batch_size": B}.items():
        tu.assign_non_tensor_data(data, key, value)
    return data


def _unpadded(per_response_token: torch.Tensor) -> torch.Tensor:
    """(B, T) response values as the model's flat output over every token of every sequence: the value
    of response token t sits at the sequence's position P - 1 + t (the output is shifted by one)."""
    flat = torch.zeros(B, P + T)
    flat[:, P - 1:P - 1 + T] = per_response_token
    return flat.reshape(-1)


def test_the_entropy_bonus_and_the_kl_are_token_means_whatever_the_policy_losss_aggregation():
    gen = torch.Generator().manual_seed(0)
    mask = torch.ones(B, T)
    mask[0, 2:] = 0  # responses of different lengths: a sequence mean of token sums differs from a token mean
    mask[3, 1:] = 0
    entropy = torch.rand(B, T, generator=gen) * 2
    log_prob = -torch.rand(B, T, generator=gen) - 0.5
    old_log_prob = log_prob - 0.3 * torch.rand(B, T, generator=gen)
    settings = ActorLossSettings(loss=MixedLossConfig(), loss_agg_mode="seq-mean-token-sum-norm",
                                 entropy_coeff=0.001, kl_coeff=0.01, loss_scale_factor=T)
    loss, metrics = exgrpo_actor_loss(settings, {"log_probs": _unpadded(log_prob), "entropy": _unpadded(entropy)},
                                      _micro_batch(mask, old_log_prob))

    want_entropy = entropy_bonus(entropy, mask)  # the native backend's term
    m = mask.bool()
    want_kl = low_var_kl_per_token(log_prob, old_log_prob)[m].mean()
    assert metrics["actor/entropy_loss"].aggregate() == pytest.approx(float(want_entropy), rel=1e-5)
    assert metrics["actor/kl_loss"].aggregate() == pytest.approx(float(want_kl), rel=1e-5)
    # zero advantages: the policy loss is 0, so the loss is the two terms, with their signs
    assert float(metrics["actor/pg_loss"].aggregate()) == pytest.approx(0.0, abs=1e-7)
    assert float(loss) == pytest.approx(float(-0.001 * want_entropy + 0.01 * want_kl), rel=1e-5)
