import pytest
import torch

from exgrpo.backends.native.policy_loss import LOSS_NAME, get_exgrpo_loss_fn, register
from exgrpo.config import LossAggregation, Shaping
from exgrpo.core.advantages import grpo_advantages
from exgrpo.core.loss import MixedLossConfig, aggregate, compute_exgrpo_policy_loss


def test_registered_in_verl_registry():
    from verl.trainer.ppo import core_algos

    register()
    assert core_algos.get_policy_loss_fn(LOSS_NAME) is compute_exgrpo_policy_loss
    assert get_exgrpo_loss_fn() is compute_exgrpo_policy_loss


@pytest.mark.parametrize("w", [0.05, 0.1, 1.0, 3.0])
def test_policy_shaping_gradient(w):
    # l = -A f(w), f(w) = w/(w+g): dl/dw = -A g/(w+g)^2, and dl/dlogp = dl/dw * w
    gamma, adv = 0.1, 0.7
    log_prob = torch.tensor([[0.0]], requires_grad=True)
    old = torch.tensor([[-torch.log(torch.tensor(w)).item()]])
    loss, m = compute_exgrpo_policy_loss(
        old, log_prob, torch.tensor([[adv]]), torch.tensor([[True]]), "token-mean",
        MixedLossConfig(shaping=Shaping.POLICY_SHAPING, shaping_gamma=gamma),
        off_policy_mask=torch.tensor([[True]]),
    )
    loss.backward()
    assert log_prob.grad.item() / w == pytest.approx(-adv * gamma / (w + gamma) ** 2, rel=1e-5)
    assert m["actor/off_ratio_mean"] == pytest.approx(w, rel=1e-5)


def test_truncation_and_identity():
    log_prob = torch.zeros(1, 3)
    old = torch.log(torch.tensor([[0.5, 2.0, 5.0]]))  # w = 2, 0.5, 0.2
    adv, mask = torch.ones(1, 3), torch.ones(1, 3, dtype=torch.bool)
    cfg = MixedLossConfig(shaping=Shaping.TRUNCATE, is_clip=1.0, norm_length=1)
    loss, _ = compute_exgrpo_policy_loss(old, log_prob, adv, mask, "token-sum-norm", cfg, off_policy_mask=mask)
    assert loss.item() == pytest.approx(-(1.0 + 0.5 + 0.2), rel=1e-5)
    cfg = MixedLossConfig(shaping=Shaping.IDENTITY)
    loss, _ = compute_exgrpo_policy_loss(old, log_prob, adv, mask, "token-mean", cfg, off_policy_mask=mask)
    assert loss.item() == pytest.approx(-(2.0 + 0.5 + 0.2) / 3, rel=1e-5)


def test_on_policy_part_equals_verl_vanilla_clipped_loss():
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.workers.config.actor import ActorConfig

    g = torch.Generator().manual_seed(0)
    old = -torch.rand(6, 5, generator=g)
    log_prob = old + 0.5 * torch.randn(6, 5, generator=g)
    adv = torch.randn(6, 1, generator=g).expand(6, 5).contiguous()
    mask = torch.rand(6, 5, generator=g) > 0.2
    cfg = ActorConfig(strategy="fsdp", rollout_n=2, ppo_micro_batch_size_per_gpu=6, use_torch_compile=False,
                      clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.2)
    ref, _ = get_policy_loss_fn("vanilla")(old, log_prob, adv, mask, "token-mean", cfg)
    ours, m = compute_exgrpo_policy_loss(old, log_prob, adv, mask, "token-mean", MixedLossConfig(clip_eps=0.2))
    assert ours.item() == pytest.approx(ref.item(), rel=1e-5, abs=1e-7)
    assert m["actor/off_token_fraction"] == 0.0


def test_clip_dropped_after_replay_start_is_plain_ratio():
    old, log_prob = torch.zeros(1, 1), torch.tensor([[1.0]])  # r = e, far outside the clip range
    args = (old, log_prob, torch.ones(1, 1), torch.ones(1, 1, dtype=torch.bool), "token-mean")
    clipped, _ = compute_exgrpo_policy_loss(*args, MixedLossConfig(clip_on_policy=True))
    unclipped, _ = compute_exgrpo_policy_loss(*args, MixedLossConfig(clip_on_policy=False))
    assert clipped.item() == pytest.approx(-1.2)
    assert unclipped.item() == pytest.approx(-torch.e, rel=1e-6)


def test_aggregations():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    assert aggregate(loss, mask, LossAggregation.TOKEN_MEAN).item() == pytest.approx(2.5)
    assert aggregate(loss, mask, LossAggregation.SEQ_MEAN_TOKEN_MEAN).item() == pytest.approx(3.0)
    assert aggregate(loss, mask, LossAggregation.SEQ_MEAN_TOKEN_SUM).item() == pytest.approx(5.0)
    assert aggregate(loss, mask, LossAggregation.TOKEN_SUM_NORM, norm_length=8).item() == pytest.approx(10 / 8)


def test_grpo_advantages():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    assert torch.allclose(grpo_advantages(r), torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.0, 0.0, 0.0, 0.0]]))
    assert torch.allclose(grpo_advantages(r, std_norm=True)[0], torch.tensor([1.0, -1.0, -1.0, 1.0]))
    assert torch.all(grpo_advantages(r, std_norm=True)[1] == 0)


def test_metric_names_are_mlflow_safe():
    import re

    _, m = compute_exgrpo_policy_loss(torch.zeros(2, 2), torch.zeros(2, 2), torch.ones(2, 2),
                                      torch.ones(2, 2, dtype=torch.bool), off_policy_mask=torch.eye(2, dtype=torch.bool))
    assert all(re.fullmatch(r"[\w./ :-]+", k) for k in m)
