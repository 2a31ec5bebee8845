"""The paper tier against the reference's recipe, field by field.

The rows live in one place, the tables of docs/gpu.md ("The reference recipe, field by field"): this
test reads them, composes veRL's config from experiments/paper-exgrpo.yaml as a run composes it
(nothing runs), and checks every row's value there, so the page and the file cannot drift apart.
"""

from __future__ import annotations

import re
import sys
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

from exgrpo.config import ConfigError, load_experiment

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "gpu.md"
PAPER = ROOT / "experiments" / "paper-exgrpo.yaml"
SECTION = "## The reference recipe, field by field"
SHORTENED = ("actor.", "rollout.", "model.", "ref.")
"""veRL keys the tables write without their ``actor_rollout_ref.`` prefix."""
NOTHING = "—"
CODE = re.compile(r"`([^`]*)`")

SCRIPT_FIELDS = (
    "algorithm.adv_estimator", "trainer.experience", "trainer.exp_metric", "trainer.exp_select_mode",
    "trainer.exp_sample_range", "trainer.exp_bucket_manager", "trainer.experience_ratio",
    "trainer.experience_start_sratio", "trainer.exp_is_correct", "trainer.experience_lbound",
    "trainer.experience_rbound", "data.train_files", "data.val_files", "data.train_batch_size",
    "data.val_batch_size", "data.max_prompt_length", "data.max_response_length", "model.path", "actor.optim.lr",
    "model.use_remove_padding", "actor.ppo_mini_batch_size", "actor.ppo_micro_batch_size", "actor.use_dynamic_bsz",
    "actor.ppo_max_token_len_per_gpu", "actor.kl_loss_coef", "actor.kl_loss_type",
    "actor.ulysses_sequence_parallel_size", "model.enable_gradient_checkpointing", "actor.fsdp_config.param_offload",
    "actor.fsdp_config.grad_offload", "actor.fsdp_config.optimizer_offload", "rollout.tensor_model_parallel_size",
    "rollout.name", "rollout.temperature", "rollout.val_temperature", "rollout.gpu_memory_utilization", "rollout.n",
    "rollout.n_val", "ref.fsdp_config.param_offload", "rollout.max_prefix_len", "algorithm.kl_ctrl.kl_coef",
    "actor.entropy_coeff", "trainer.critic_warmup", "trainer.logger", "trainer.project_name",
    "trainer.experiment_name", "trainer.default_local_dir", "trainer.val_before_train", "trainer.n_gpus_per_node",
    "trainer.nnodes", "trainer.save_freq", "trainer.test_freq", "actor.use_kl_loss", "actor.use_sft_prefix_reward",
    "rollout.prefix_share_across_samples", "rollout.prefix_strategy", "rollout.n_prefix", "rollout.min_prefix_ratio",
    "rollout.max_prefix_ratio", "rollout.prefix_reward_weight_alpha", "ref.use_ref", "actor.use_off_policy_loss",
    "actor.off_policy_normalize", "actor.off_policy_reshape", "actor.off_policy_loss_impl", "algorithm.grpo_use_std",
    "actor.loss_remove_token_mean", "actor.loss_remove_clip", "data.reward_impl_version", "trainer.max_optim_to_keep",
    "data.shuffle", "trainer.default_hdfs_dir", "actor.skip_grad_bound", "trainer.total_training_steps",
    "VLLM_ATTENTION_BACKEND", "OMP_NUM_THREADS",
)
"""Every field (and environment variable) that ``ExGRPO/exp_scripts/run_exgrpo.sh`` of the LUFFY repository
(commit 01f4ae0) sets, written as the tables write them: each needs a row."""


class Row(NamedTuple):
    reference: str
    there: str
    here: str
    value: str
    why: str


def recipe_rows() -> list[Row]:
    """The rows of every table in the page's recipe section."""
    text = PAGE.read_text()
    assert SECTION in text, f"{PAGE} has no section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if not line.startswith("|") or line.startswith(("|---", "| Reference field")):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == len(Row._fields), f"a row of {len(cells)} cells, not {len(Row._fields)}: {line}"
        rows.append(Row(*cells))
    return rows


def normal(x: Any) -> Any:
    """A value as the tables and both configs can be compared: enums by value, numbers as floats
    (YAML reads ``1e-6`` as a string), lists item by item."""
    from omegaconf import ListConfig

    if isinstance(x, Enum):
        x = x.value
    if isinstance(x, Path):
        x = str(x)
    if isinstance(x, bool) or x is None:
        return x
    if isinstance(x, int | float):
        return float(x)
    if isinstance(x, str):
        try:
            return float(x)
        except ValueError:
            return x
    if isinstance(x, list | tuple | ListConfig):
        return [normal(v) for v in x]
    return x


def written(cell: str) -> Any:
    """A cell's value: the YAML of its one code span, else its text."""
    match = re.fullmatch(r"`([^`]*)`", cell)
    return normal(yaml.safe_load(match.group(1))) if match else cell


def composed():
    """The typed config of the paper file and veRL's config composed from it, as a run composes it."""
    from exgrpo.backends.verl.overrides import RunPaths, compose, hydra_overrides

    cfg = load_experiment(PAPER)
    v = cfg.backend.verl
    paths = RunPaths(v.model_path, v.train_files, v.val_files, cfg.run_dir() / "checkpoints", Path("/reward.py"))
    return cfg, compose(hydra_overrides(cfg, paths))


def looked_up(cfg, verl_config, here: str) -> Any:
    """The value a Here cell names: veRL `key` in veRL's config, `key` in the typed config."""
    from omegaconf import OmegaConf

    match = re.fullmatch(r"(veRL )?`([^`]+)`", here)
    assert match, f"Here cell {here!r}: write veRL `key`, `key` or {NOTHING}"
    key = match.group(2)
    if match.group(1):
        full = f"actor_rollout_ref.{key}" if key.startswith(SHORTENED) else key
        absent = object()
        found = OmegaConf.select(verl_config, full, default=absent)
        assert found is not absent, f"veRL's config has no {full}"
        return found
    node = cfg
    for part in key.split("."):
        assert hasattr(node, part), f"the typed config has no {key}"
        node = getattr(node, part)
    return node


def test_every_field_the_reference_script_sets_has_a_row():
    named = {key for row in recipe_rows() for key in CODE.findall(row.reference)}
    missing = [f for f in SCRIPT_FIELDS if f not in named]
    assert not missing, f"{PAGE.name}: no row for {missing}"


def test_every_row_holds_in_the_config_composed_from_the_paper_file():
    cfg, verl_config = composed()
    wrong = []
    for row in recipe_rows():
        if row.here == NOTHING:
            if row.value != NOTHING or not row.why:
                wrong.append(f"{row.reference}: nothing here corresponds, so Value is {NOTHING} and Why says why")
            continue
        got = normal(looked_up(cfg, verl_config, row.here))
        if got != written(row.value):
            wrong.append(f"{row.reference}: {row.here} is {got!r} in the composed config, the table says {row.value}")
        if written(row.there) != written(row.value) and not row.why:
            wrong.append(f"{row.reference}: {row.there} there, {row.value} here, and no why")
    assert not wrong, "\n".join(wrong)


def test_a_model_too_short_for_prompt_and_response_is_refused_in_one_line_before_any_work(tmp_path):
    """veRL sizes vLLM's context from the model's config: a shorter model would cut every response."""
    from exgrpo.backends.verl.assets import check_model_context
    from exgrpo.backends.verl.runner import prepare

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen2", "max_position_embeddings": 4096}')
    out = tmp_path / "runs"
    cfg = load_experiment(PAPER, {"backend.verl.model_path": str(model), "output_dir": str(out),
                                  "backend.verl.python": sys.executable,
                                  "backend.verl.max_prompt_length": 1024, "policy.max_new_tokens": 8192})
    with pytest.raises(ConfigError) as err:
        prepare(cfg)
    (line,) = str(err.value).splitlines()
    assert line.startswith(f"backend.verl.model_path={model}: the model holds 4096 positions")
    assert "backend.verl.max_prompt_length + policy.max_new_tokens = 9216" in line and "docs/gpu.md" in line
    assert not out.exists()

    (model / "config.json").write_text('{"model_type": "qwen2", "max_position_embeddings": 16384}')
    check_model_context(cfg)
    check_model_context(load_experiment(PAPER, {"backend.verl.model_path": str(tmp_path / "elsewhere")}))
