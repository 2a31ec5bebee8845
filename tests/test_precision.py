"""bf16 compute for the LM policies (``policy.precision``, and bf16 weights, ``policy.dtype``): the on-policy
ratio of a bf16 step starts at 1, fp32 runs are untouched, and a CPU without bf16 matmul (or, for bf16
weights, without oneDNN's bf16 kernels) is refused before any work, in one line. Other CPUs are shown to
the checks by the text of their ``/proc/cpuinfo`` (tests/fixtures/cpuinfo)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from exgrpo.backends.native import trainer as trainer_module  # noqa: E402
from exgrpo.config import ConfigError, ExperimentConfig, LMPolicyConfig, TextArithmeticTaskConfig  # noqa: E402
from pathlib import Path  # noqa: E402

from exgrpo.policies.lm import precision  # noqa: E402
from exgrpo.policies.lm.policy import LMPolicy  # noqa: E402
from exgrpo.policies.lm.tiny_lm import TinyLMConfig, build_model  # noqa: E402
from exgrpo.tasks.text_arithmetic import TextArithmetic  # noqa: E402

TASK = TextArithmeticTaskConfig(n_train=200, n_val=50, data_seed=7)
MODEL = TinyLMConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)
CPUINFO = Path(__file__).parent / "fixtures" / "cpuinfo"
AVX2_ONLY = CPUINFO / "amd-epyc-7b12-avx2.txt"
"""A Zen 2 EPYC: avx2, no AVX-512 at all."""
ARM_BF16 = CPUINFO / "neoverse-v1-graviton3.txt"
"""A Neoverse V1 (AWS Graviton3): bf16 in its Features."""
ARM_NO_BF16 = CPUINFO / "neoverse-n1-graviton2.txt"
"""A Neoverse N1 (AWS Graviton2): no bf16."""
HERE_BF16 = precision.bf16_matmul(precision.cpu_flags()) and precision.bf16_weights(precision.cpu_flags())


def _policy(task: TextArithmetic, prec: str, weights: torch.dtype = torch.float32) -> LMPolicy:
    """A random tiny Llama whose head is sharpened (x6), so that bf16 rounding moves its log-probs by a
    few hundredths (measured: up to 0.03 in the ratio against the fp32 sampler), as the SFT warm start's do;
    its weights in ``weights``."""
    torch.manual_seed(0)
    model = build_model(MODEL, task.tokenizer)
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)
    model.to(weights)
    return LMPolicy(model, task.tokenizer.pad_id, task.tokenizer.eos_id,
                    LMPolicyConfig(max_new_tokens=12, precision=prec))


def _first_step_ratios(tmp_path, monkeypatch, prec: str, old_from_sampler: bool = False,
                       weights: torch.dtype = torch.float32) -> torch.Tensor:
    """exp(log pi_new - log pi_old) of every token of one trainer step's only mini-batch (before any update:
    on-policy), as the loss receives them. ``old_from_sampler``: pi_old left as the sampler's."""
    monkeypatch.setattr(precision, "CPUINFO", ARM_BF16)  # the checks pass on any CI machine
    monkeypatch.setattr(precision, "_torch_bf16_supported", lambda: True)  # autocast runs bf16 products anywhere
    task = TextArithmetic(TASK)
    policy = _policy(task, prec, weights)
    if old_from_sampler:
        monkeypatch.setattr(policy, "with_training_log_probs", lambda prompts, rollout: rollout)
    cfg = ExperimentConfig.model_validate({
        "tier": "tiny-lm", "output_dir": str(tmp_path), "policy": {"max_new_tokens": 12, "precision": prec},
        "train": {"batch_size": 8, "max_steps": 1, "mini_batches": 1}, "algorithm": {"group_size": 4, "replay": "none"},
    })
    seen: list[torch.Tensor] = []
    objective = trainer_module.exgrpo_objective

    def recording(loss_fn, old_log_prob, log_prob, entropy, adv, mask, *rest):
        seen.append(((log_prob.detach() - old_log_prob).exp())[mask.bool()])
        return objective(loss_fn, old_log_prob, log_prob, entropy, adv, mask, *rest)

    monkeypatch.setattr(trainer_module, "exgrpo_objective", recording)
    trainer_module.Trainer(cfg, task=task, policy=policy).train_step()
    assert len(seen) == 1 and seen[0].numel() > 50
    return seen[0]


def test_a_bf16_steps_on_policy_ratio_is_one_up_to_rounding(tmp_path, monkeypatch):
    """pi_old of the fresh rows is re-scored by the bf16 training forward, so the first mini-batch's
    ratio is 1 (the same forward on a different batch composition; measured 0 here)."""
    ratio = _first_step_ratios(tmp_path, monkeypatch, "bf16")
    assert float((ratio - 1).abs().max()) < 1e-3


def test_with_the_fp32_samplers_log_probs_the_bf16_ratio_is_not_one(tmp_path, monkeypatch):
    """The negative control of the test above: pi_old from the fp32 sampler puts on-policy ratios a few
    hundredths from 1 (what the re-score removes), so that test can fail."""
    ratio = _first_step_ratios(tmp_path, monkeypatch, "bf16", old_from_sampler=True)
    assert float((ratio - 1).abs().max()) > 1e-2


@pytest.mark.skipif(not HERE_BF16, reason="this CPU has no oneDNN bf16 kernels, which bf16 weights need")
def test_a_bf16_weight_steps_on_policy_ratio_is_one_up_to_rounding(tmp_path, monkeypatch):
    """bf16 weights (``policy.dtype: bfloat16``) sample on the bf16 decoder and train on the bf16 packed
    forward, two bf16 computations: pi_old is re-scored by the training forward, so the ratio starts at 1."""
    ratio = _first_step_ratios(tmp_path, monkeypatch, "fp32", weights=torch.bfloat16)
    assert float((ratio - 1).abs().max()) < 1e-3


@pytest.mark.skipif(not HERE_BF16, reason="this CPU has no oneDNN bf16 kernels, which bf16 weights need")
def test_with_the_bf16_samplers_log_probs_the_bf16_weight_ratio_is_not_one(tmp_path, monkeypatch):
    """The negative control of the test above: the bf16 decoder's own log-probs as pi_old put on-policy
    ratios away from 1 (what the re-score removes), so that test can fail."""
    ratio = _first_step_ratios(tmp_path, monkeypatch, "fp32", old_from_sampler=True, weights=torch.bfloat16)
    assert float((ratio - 1).abs().max()) > 1e-2


def test_fp32_runs_no_extra_forward(tmp_path, monkeypatch):
    """fp32 samples and trains on one numeric path: pi_old is the rollout's own, no re-score runs."""
    task = TextArithmetic(TASK)
    policy = _policy(task, "fp32")
    ro = policy.generate(task.prompts(list(task.train_ids[:4])), torch.Generator().manual_seed(0))
    calls = []
    monkeypatch.setattr(policy, "score", lambda *a, **k: calls.append(a))
    assert policy.with_training_log_probs(task.prompts(list(task.train_ids[:4])), ro) is ro and not calls
    ratio = _first_step_ratios(tmp_path, monkeypatch, "fp32")
    assert float((ratio - 1).abs().max()) < 1e-4


def test_bf16_scoring_is_autocast_over_fp32_weights():
    """The weights stay fp32 (AdamW's master copy); the forward runs bf16 products, so its log-probs are
    not fp32's, and its gradients reach the fp32 weights."""
    task = TextArithmetic(TASK)
    pol32, pol16 = _policy(task, "fp32"), _policy(task, "bf16")
    prompts = task.prompts(list(task.train_ids[:4]))
    ro = pol32.generate(prompts, torch.Generator().manual_seed(0))
    s32, s16 = pol32.score(prompts, ro.tokens, ro.mask), pol16.score(prompts, ro.tokens, ro.mask)
    assert s16.log_prob.dtype == torch.float32 and all(p.dtype == torch.float32 for p in pol16.parameters())
    assert float((s16.log_prob - s32.log_prob).detach().abs().max()) > 1e-3
    s16.log_prob.sum().backward()
    assert pol16.model.lm_head.weight.grad is not None and pol16.model.lm_head.weight.grad.dtype == torch.float32


@pytest.mark.parametrize("setting,words", [
    ("policy.precision=bf16", ["avx512_bf16", "policy.precision=fp32"]),
    ("policy.dtype=bfloat16", ["avx512bw, avx512vl, avx512dq", "avx_ne_convert", "policy.dtype=float32"]),
    ("policy.rollout_precision=bf16", ["avx512bw, avx512vl, avx512dq", "policy.rollout_precision=fp32"]),
])
def test_bf16_on_a_cpu_without_it_is_refused_before_any_work(setting, words, tmp_path, monkeypatch, capsys):
    """``exgrpo train`` with bf16 compute or bf16 weights on an AVX2-only CPU: exit 2 and one line naming
    the field, the CPU flags and the fix, before any run directory, record or warm start exists."""
    from exgrpo.cli import main

    monkeypatch.setattr(precision, "CPUINFO", AVX2_ONLY)
    monkeypatch.setenv("EXGRPO_CACHE", str(tmp_path / "cache"))
    code = main(["train", "experiments/smollm2-arith.yaml", "--set", setting, "--no-tracking", "--max-steps", "1",
                 "--output-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert setting in err and "AMD EPYC 7B12" in err and all(w in err for w in words), err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()


def test_the_cpu_checks_read_x86_flags_and_arm_features():
    avx2, arm, arm_old = (p.read_text() for p in (AVX2_ONLY, ARM_BF16, ARM_NO_BF16))
    assert "avx2" in precision.cpu_flags(avx2) and "bf16" in precision.cpu_flags(arm)
    for text in (avx2, arm, arm_old):  # fp32 passes everywhere
        precision.check_precision("fp32", cpuinfo=text)
        precision.check_weights_dtype("float32", cpuinfo=text)
    precision.check_precision("bf16", cpuinfo=arm)  # an ARM CPU with bf16 computes in it
    precision.check_weights_dtype("bfloat16", cpuinfo=arm)
    with pytest.raises(ConfigError, match=r"avx512_bf16 or amx_bf16 in /proc/cpuinfo's flags, or bf16 in an ARM"):
        precision.check_precision("bf16", cpuinfo=avx2)
    with pytest.raises(ConfigError, match=r"an ARM CPU \(implementer 0x41, part 0xd0c\) has none"):
        precision.check_precision("bf16", cpuinfo=arm_old)
    with pytest.raises(ConfigError, match=r"^policy.dtype=bfloat16 needs .*AMD EPYC 7B12 has none: set policy.dtype=float32$"):
        precision.check_weights_dtype("bfloat16", cpuinfo=avx2)
    with pytest.raises(ConfigError, match="part 0xd0c"):
        precision.check_weights_dtype("bfloat16", cpuinfo=arm_old)
    here = precision.cpu_flags()  # this machine's own
    assert isinstance(here, frozenset) and (not Path("/proc/cpuinfo").exists() or here)
    if HERE_BF16:
        precision.check_precision("bf16")
        precision.check_weights_dtype("bfloat16")


@pytest.mark.parametrize("overrides,words", [
    ({"tier": "smollm2", "policy": {"dtype": "bfloat16", "precision": "bf16"}}, ["precision=bf16", "dtype=float32"]),
    ({"tier": "tiny-lm", "backend": {"name": "verl"}, "policy": {"precision": "bf16"}}, ["native trainer", "actor_dtype=bfloat16"]),
])
def test_contradictory_precision_settings_are_one_config_error(overrides, words):
    from exgrpo.config import validate_config

    with pytest.raises(ConfigError) as e:
        validate_config(ExperimentConfig, overrides, source="test")
    assert all(w in str(e.value) for w in words), str(e.value)


def test_a_ratio_is_one_where_the_mini_batches_split_the_batch():
    """The trainer re-scores the whole batch once and trains on mini-batches: another row composition of
    the same bf16 forward, which moves a ratio by rounding only."""
    task = TextArithmetic(TASK)
    policy = _policy(task, "bf16")
    prompts = [p for p in task.prompts(list(task.train_ids[:8])) for _ in range(4)]
    ro = policy.with_training_log_probs(prompts, policy.generate(prompts, torch.Generator().manual_seed(0)))
    worst = 0.0
    for chunk in np.array_split(np.random.default_rng(0).permutation(len(prompts)), 4):
        idx = torch.as_tensor(chunk)
        with torch.no_grad():
            new = policy.score([prompts[i] for i in chunk], ro.tokens[idx], ro.mask[idx]).log_prob
        worst = max(worst, float(((new - ro.log_prob[idx]).exp() - 1)[ro.mask[idx]].abs().max()))
    assert worst < 1e-3


@pytest.mark.skipif(not HERE_BF16, reason="this CPU has no oneDNN bf16 kernels, which a bf16 sampler needs")
def test_a_bf16_sampler_decodes_a_bf16_copy_of_the_current_weights_outside_the_policys_state(tmp_path, monkeypatch):
    """``policy.rollout_precision: bf16``: rollouts come from a bfloat16 copy of the fp32 weights, refreshed
    before each rollout (after an update, the copy samples as a fresh bf16 cast of the new weights), which is
    neither a parameter nor in the checkpoint; the rollout's log-probs are re-scored (the ratio starts at 1)."""
    task = TextArithmetic(TASK)
    policy = _policy(task, "bf16")
    policy32 = _policy(task, "bf16")
    policy = LMPolicy(policy.model, task.tokenizer.pad_id, task.tokenizer.eos_id,
                      LMPolicyConfig(max_new_tokens=12, precision="bf16", rollout_precision="bf16"))
    keys, n_params = set(policy.state_dict()), len(list(policy.parameters()))
    prompts = task.prompts(list(task.train_ids[:8]))

    def cast_rollout() -> torch.Tensor:
        import copy

        cast = copy.deepcopy(policy.model)
        for p in cast.parameters():
            p.data = p.data.to(torch.bfloat16)  # the weights; RoPE's frequencies stay fp32, as the sampler keeps them
        ref = LMPolicy(cast, task.tokenizer.pad_id, task.tokenizer.eos_id, LMPolicyConfig(max_new_tokens=12, precision="bf16"))
        return ref.generate(prompts, torch.Generator().manual_seed(3), greedy=True).tokens

    first = policy.generate(prompts, torch.Generator().manual_seed(3), greedy=True).tokens
    assert torch.equal(first, cast_rollout())
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # an update
    after = policy.generate(prompts, torch.Generator().manual_seed(3), greedy=True).tokens
    assert torch.equal(after, cast_rollout()) and not torch.equal(after, first)
    assert set(policy.state_dict()) == keys and len(list(policy.parameters())) == n_params
    assert next(policy.model.parameters()).dtype == torch.float32
    assert policy32.rollout_precision is precision.Precision.FP32 and policy.rollout_precision is precision.Precision.BF16
    ro = policy.generate(prompts, torch.Generator().manual_seed(0))
    rescored = policy.with_training_log_probs(prompts, ro)
    assert not torch.equal(rescored.log_prob, ro.log_prob)  # pi_old is the training forward's, not the sampler's


def test_the_bf16_sampler_copy_rounds_the_weights_and_nothing_else():
    """The sampler's copy holds the weights in bfloat16 and every buffer as the model holds it: RoPE's inverse
    frequencies rounded to bf16 would move every rotary angle by up to 0.2% (half a bf16 unit in the last place),
    a difference from the training forward that is not the weights' rounding."""
    task = TextArithmetic(TASK)
    base = _policy(task, "bf16")
    policy = LMPolicy(base.model, task.tokenizer.pad_id, task.tokenizer.eos_id,
                      LMPolicyConfig(max_new_tokens=12, precision="bf16", rollout_precision="bf16"))
    copy_ = policy._sampler()
    assert copy_ is not policy.model and all(p.dtype == torch.bfloat16 for p in copy_.parameters())
    buffers = dict(policy.model.named_buffers())
    floating = {n: b for n, b in copy_.named_buffers() if b.is_floating_point()}
    assert any("inv_freq" in n for n in floating), list(floating)
    for name, b in floating.items():
        assert b.dtype == buffers[name].dtype and torch.equal(b, buffers[name]), name


def test_a_step_leaves_no_gradients_behind(tmp_path, monkeypatch):
    """The gradients are freed after each optimiser step: rollouts, evaluations and checkpoints between two
    steps do not hold a second copy of the weights."""
    monkeypatch.setattr(precision, "CPUINFO", ARM_BF16)
    task = TextArithmetic(TASK)
    policy = _policy(task, "fp32")
    cfg = ExperimentConfig.model_validate({
        "tier": "tiny-lm", "output_dir": str(tmp_path), "policy": {"max_new_tokens": 12},
        "train": {"batch_size": 8, "max_steps": 1, "mini_batches": 2}, "algorithm": {"group_size": 4, "replay": "none"},
    })
    trainer = trainer_module.Trainer(cfg, task=task, policy=policy)
    trainer.train_step()
    assert all(p.grad is None for p in policy.parameters())
