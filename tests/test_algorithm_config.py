"""The algorithm section is a discriminated union: one class per algorithm, each with only its own fields."""

import pytest

from exgrpo.config import (
    ALGORITHM_CONFIGS,
    ConfigError,
    ExGRPOConfig,
    ExperimentConfig,
    GRPOConfig,
    NotebookConfig,
    ReplayKind,
    UniformReplayConfig,
    config_fields,
    field_docs,
    load_compare,
    load_experiment,
    mlflow_param_keys,
)
from exgrpo.runs import run_identity_diff
from exgrpo.tracking.mlflow_tracking import curated_params


@pytest.mark.parametrize(("replay", "cls"), [("none", GRPOConfig), ("buckets", ExGRPOConfig),
                                             ("uniform", UniformReplayConfig), ("notebook", NotebookConfig)])
def test_replay_picks_the_class_and_its_fields(replay, cls):
    algo = load_experiment("experiments/toy-grpo.yaml", {"algorithm.replay": replay}).algorithm
    assert type(algo) is cls and ALGORITHM_CONFIGS[ReplayKind(replay)] is cls
    assert hasattr(algo, "experience_ratio") == (replay in ("buckets", "uniform"))
    assert hasattr(algo, "bucket_sigma") == (replay == "buckets")
    assert hasattr(algo, "notebook") == (replay == "notebook")


def test_no_replay_key_is_the_papers_exgrpo():
    assert type(ExperimentConfig().algorithm) is ExGRPOConfig
    assert type(ExperimentConfig.model_validate({"algorithm": {"group_size": 4}}).algorithm) is ExGRPOConfig


def test_a_field_of_another_algorithm_is_a_one_line_error_naming_it():
    with pytest.raises(ConfigError) as e:
        load_experiment("experiments/toy-grpo.yaml", {"algorithm.experience_ratio": 0.25})
    msg = str(e.value).splitlines()[-1]
    assert "experience_ratio=0.25 is a setting of replay=buckets/uniform, not of replay=none" in msg
    with pytest.raises(ConfigError, match="notebook.*replay=notebook, not of replay=buckets"):
        load_experiment("experiments/toy-exgrpo.yaml", {"algorithm.notebook.per": 8})
    with pytest.raises(ConfigError, match="replay='bucket' is not a replay kind"):
        load_experiment("experiments/toy-exgrpo.yaml", {"algorithm.replay": "bucket"})


def test_error_locations_name_the_field_not_the_union_member():
    with pytest.raises(ConfigError) as e:
        load_experiment("experiments/toy-exgrpo.yaml", {"algorithm.experience_ratio": 3})
    assert "  algorithm.experience_ratio: Input should be less than or equal to 1" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_experiment("experiments/tiny-lm.yaml", {"task.n_train": 0})
    assert "  task.n_train: " in str(e.value)


def test_a_resolved_config_from_before_the_split_still_loads_and_resumes():
    """Until 2026-11-23 every run's saved config listed every algorithm field; at their defaults they
    are dropped, so old checkpoints resume and evaluate."""
    grpo = load_experiment("experiments/toy-grpo.yaml")
    old = grpo.model_dump(mode="json")
    old["algorithm"].update({**ExGRPOConfig().model_dump(mode="json"), **old["algorithm"]})
    old["algorithm"]["notebook"] = NotebookConfig().notebook.model_dump(mode="json")
    assert "experience_ratio" in old["algorithm"] and old["algorithm"]["replay"] == "none"
    again = ExperimentConfig.model_validate(old)
    assert again == grpo
    assert run_identity_diff(old, grpo.model_dump(mode="json")) == []
    old["algorithm"]["experience_ratio"] = 0.3  # a value that meant something is not silently dropped
    with pytest.raises(ValueError, match="experience_ratio=0.3"):
        ExperimentConfig.model_validate(old)


def test_comparison_base_fields_apply_to_the_arms_that_have_them(tmp_path):
    cc = load_compare("experiments/toy.yaml", {"algorithm.experience_ratio": 0.25})
    assert cc.arm_config("exgrpo", 0).algorithm.experience_ratio == 0.25
    assert not hasattr(cc.arm_config("grpo", 0).algorithm, "experience_ratio")
    p = tmp_path / "c.yaml"
    p.write_text("base: {algorithm: {experience_ratio: 0.3}}\n"
                 "arms: {grpo: {algorithm.replay: none}, nb: {algorithm.replay: notebook}}\n")
    with pytest.raises(ConfigError, match="base sets algorithm.experience_ratio.*which no arm runs"):
        load_compare(p)
    p.write_text("base: {}\narms: {grpo: {algorithm.replay: none, algorithm.is_clip: 3}}\n")
    with pytest.raises(ConfigError, match="arm 'grpo': algorithm: is_clip=3 is a setting of replay=buckets"):
        load_compare(p)


def test_field_docs_and_search_space_fields_cover_every_algorithm():
    docs = {name: doc for name, _, doc in field_docs()}
    assert docs["algorithm.bucket_sigma"].endswith("[algorithm.replay=buckets]")
    assert docs["algorithm.experience_ratio"].endswith("[algorithm.replay=buckets|uniform]")
    assert "[" not in docs["algorithm.group_size"]
    assert "One of: buckets, none, uniform, notebook" in docs["algorithm.replay"]
    assert {"algorithm.notebook.per", "algorithm.bucket_sigma", "task.n_train"} <= set(config_fields())


def test_mlflow_params_hold_the_fields_of_the_runs_own_algorithm():
    grpo = curated_params(load_experiment("experiments/toy-grpo.yaml"))
    exgrpo = curated_params(load_experiment("experiments/toy-exgrpo.yaml"))
    assert grpo["algorithm.replay"] == "none" and "algorithm.experience_ratio" not in grpo
    assert exgrpo["algorithm.experience_ratio"] == "0.5" and exgrpo["algorithm.bucket_sigma"] == "1.0"
    keys = mlflow_param_keys(load_experiment("experiments/tiny-lm.yaml"))
    assert "task.answer_format" in keys and "backend.name" in keys and "train.threads" in keys
    assert "train.checkpoint_every" not in keys
