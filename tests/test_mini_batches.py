"""How a step's batch is cut into its ``train.mini_batches`` (``train.mini_batch_split``): ``rows`` is the
random row partition the trainer has always drawn (the same draw from the same stream), ``groups`` keeps each
question's K rows together, so that the training forward meets each prompt in one mini-batch only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from exgrpo.config import ConfigError, ExperimentConfig, MiniBatchSplit, TextArithmeticTaskConfig
from exgrpo.config.experiment import validate_config
from exgrpo.core.batch import mini_batch_rows


def test_rows_is_the_permutation_of_the_rows_cut_in_parts_drawn_as_before():
    got = mini_batch_rows(np.random.default_rng(3), 20, 4, 3)
    want = np.array_split(np.random.default_rng(3).permutation(20), 3)
    assert [c.tolist() for c in got] == [c.tolist() for c in want]


@pytest.mark.parametrize(("groups", "k", "parts"), [(4, 4, 2), (5, 4, 3), (8, 1, 8), (3, 8, 1)])
def test_groups_keeps_each_groups_rows_together_and_every_row_once(groups, k, parts):
    chunks = mini_batch_rows(np.random.default_rng(0), groups * k, k, parts, MiniBatchSplit.GROUPS)
    assert len(chunks) == parts and all(len(c) for c in chunks)
    assert sorted(np.concatenate(chunks).tolist()) == list(range(groups * k))
    for c in chunks:
        owners = c // k
        assert all((owners == g).sum() == k for g in set(owners.tolist())), c
    assert len({len(c) // k for c in chunks}) <= 2  # near-equal, in whole groups


def test_groups_needs_a_group_for_every_mini_batch_and_verl_has_no_rows():
    with pytest.raises(ConfigError, match=r"mini_batch_split=groups needs a whole group in each of mini_batches=4, "
                                          r"but batch_size=2: lower train.mini_batches to 2"):
        validate_config(ExperimentConfig, {"train": {"batch_size": 2, "mini_batches": 4, "mini_batch_split": "groups"}},
                        source="test")
    from exgrpo.config import load_experiment

    with pytest.raises(ConfigError, match=r"train.mini_batch_split=rows has no veRL backend .* set it to groups"):
        load_experiment("experiments/verl-tiny-chain.yaml", {"train.mini_batch_split": "rows"})
    assert load_experiment("experiments/verl-tiny-chain.yaml").train.mini_batch_split is None  # veRL's own: groups


def test_the_trainer_scores_whole_groups_in_each_mini_batch(tmp_path):
    """A tiny-LM step of 8 questions x 4 in 2 mini-batches: with ``groups`` each training forward sees 4
    prompts, each with its 4 rows; with ``rows`` the questions spread over both."""
    pytest.importorskip("transformers")
    from exgrpo.backends.native.trainer import Trainer
    from exgrpo.config import LMPolicyConfig
    from exgrpo.policies.lm.policy import LMPolicy
    from exgrpo.policies.lm.tiny_lm import TinyLMConfig, build_model
    from exgrpo.tasks.text_arithmetic import TextArithmetic

    task = TextArithmetic(TextArithmeticTaskConfig(n_train=200, n_val=50, data_seed=7))
    seen: dict[str, list[list[tuple[int, ...]]]] = {}
    for split in ("rows", "groups"):
        torch.manual_seed(0)
        policy = LMPolicy(build_model(TinyLMConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                                   intermediate_size=64), task.tokenizer),
                          task.tokenizer.pad_id, task.tokenizer.eos_id, LMPolicyConfig(max_new_tokens=8))
        cfg = ExperimentConfig.model_validate({
            "tier": "tiny-lm", "output_dir": str(tmp_path / split), "policy": {"max_new_tokens": 8},
            "train": {"batch_size": 8, "max_steps": 1, "mini_batches": 2, "mini_batch_split": split},
            "algorithm": {"group_size": 4, "replay": "none"}})
        calls: list[list[tuple[int, ...]]] = []
        score = policy.score

        def spy(prompts, tokens, mask, *args, _calls=calls, _score=score, **kw):
            _calls.append([tuple(p) for p in prompts])
            return _score(prompts, tokens, mask, *args, **kw)

        policy.score = spy
        Trainer(cfg, task=task, policy=policy).train_step()
        seen[split] = calls
    for calls in seen.values():
        assert len(calls) == 2 and sum(len(c) for c in calls) == 32
    assert all(len(c) == 16 and all(c.count(p) == 4 for p in set(c)) and len(set(c)) == 4 for c in seen["groups"])
    assert any(len(set(c)) > 4 for c in seen["rows"])  # the rows' draw spreads the questions
