import subprocess
import sys
from pathlib import Path

import pytest

from exgrpo.config import ConfigError, apply_overrides, flatten, load_compare, load_experiment, parse_set


def err(overrides=None, path=None):
    with pytest.raises(ConfigError) as e:
        load_experiment(path, overrides)
    return str(e.value)


def test_experience_ratio_out_of_range_names_field_value_and_range():
    msg = err({"algorithm.experience_ratio": 1.5})
    assert "algorithm.experience_ratio" in msg and "1.5" in msg and "less than or equal to 1" in msg


def test_bucket_bounds():
    msg = err({"algorithm.bucket_lbound": 5, "algorithm.bucket_rbound": 5})
    assert "bucket_lbound=5 must be < bucket_rbound=5" in msg
    msg = err({"algorithm.bucket_rbound": 9, "algorithm.group_size": 8})
    assert "bucket_rbound=9 exceeds group_size K=8" in msg


def test_gradient_checkpointing_without_the_unpadded_forward_is_refused():
    with pytest.raises(ConfigError, match="gradient_checkpointing recomputes the unpadded training forward's layers: "
                                          "set unpadded_scoring=true"):
        load_experiment("experiments/tiny-lm-chain.yaml", {"policy.gradient_checkpointing": True,
                                                           "policy.unpadded_scoring": False})
    assert load_experiment("experiments/tiny-lm-chain.yaml", {"policy.gradient_checkpointing": True}).policy.gradient_checkpointing


def test_grad_clip_zero_says_null_disables_clipping():
    msg = err({"train.grad_clip": 0})
    assert "train.grad_clip: must be > 0; null disables clipping (got 0)" in msg
    assert load_experiment(None, {"train.grad_clip": None}).train.grad_clip is None


def test_group_size_below_two():
    msg = err({"algorithm.group_size": 1})
    assert "algorithm.group_size" in msg and "greater than or equal to 2" in msg


def test_unknown_weighting_lists_valid_names():
    msg = err({"algorithm.bucket_weighting": "gaussian"})
    assert "algorithm.bucket_weighting" in msg and "'gaussian'" in msg
    for name in ("normal", "linear", "sqrt", "linear_clip", "uniform"):
        assert name in msg


def test_unknown_field_is_named():
    msg = err({"algorithm.experince_ratio": 0.3})
    assert "algorithm.experince_ratio" in msg and "unknown field" in msg


def test_missing_yaml_names_the_path(tmp_path):
    msg = err(path=tmp_path / "nope.yaml")
    assert str(tmp_path / "nope.yaml") in msg and "not found" in msg


def test_set_parsing_and_overrides():
    assert parse_set(["a.b=0.25", "c=none", "d=[1, 2]"]) == {"a.b": 0.25, "c": "none", "d": [1, 2]}
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_set(["oops"])
    assert apply_overrides({"a": {"b": 1}}, {"a.c": 2}) == {"a": {"b": 1, "c": 2}}


def test_yaml_files_validate():
    cfg = load_experiment("experiments/toy-exgrpo.yaml", {"algorithm.experience_ratio": 0.25})
    assert cfg.algorithm.experience_ratio == 0.25 and cfg.algorithm.rbound == 15
    cc = load_compare("experiments/toy.yaml")
    assert cc.baseline == "grpo" and cc.arm_config("notebook", 3).algorithm.replay == "notebook"
    assert flatten(cfg)["algorithm.group_size"] == 16


def test_bad_arm_override_fails_at_load(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("base: {}\narms:\n  grpo: {algorithm.replay: none}\n  bad: {algorithm.experience_ratio: 2}\n")
    with pytest.raises(ConfigError, match="arm 'bad'"):
        load_compare(p)


def test_a_flow_runs_config_error_is_one_line_naming_the_field():
    """A deployment's flow run ends Failed with its error on one line (its state's message): the field
    is on the error's second line, the source on its first."""
    from exgrpo.errors import one_line

    with pytest.raises(ConfigError) as bad:
        load_experiment("experiments/toy-exgrpo.yaml", {"train.lr": "fast"})
    assert one_line(bad.value) == ("invalid config (experiments/toy-exgrpo.yaml): train.lr: Input should be a valid "
                                   "number, unable to parse string as a number (got 'fast')")
    assert one_line(ConfigError("a\n  b\nc")) == "a; b; c" and one_line(ConfigError("")) == "ConfigError"


def test_cli_rejects_bad_config_before_any_work(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "exgrpo.cli", "train", "experiments/toy-exgrpo.yaml", "--output-dir", str(tmp_path),
         "--set", "algorithm.experience_ratio=1.5"],
        capture_output=True, text=True,
    )
    assert out.returncode == 2
    assert "algorithm.experience_ratio" in out.stderr
    assert not any(tmp_path.iterdir())  # nothing was created


def test_version_flag_prints_the_package_version():
    import exgrpo

    out = subprocess.run([sys.executable, "-m", "exgrpo.cli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == f"exgrpo {exgrpo.__version__}"


def test_train_help_documents_every_field():
    out = subprocess.run([sys.executable, "-m", "exgrpo.cli", "train", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for field in ("algorithm.experience_ratio", "algorithm.shaping_gamma", "train.checkpoint_every", "--resume"):
        assert field in out.stdout
    lines = out.stdout.splitlines()
    assert any(line.strip().startswith("policy.decoder =") and line.endswith("[resume-safe]") for line in lines)
    assert any(line.strip().startswith("train.lr =") and not line.endswith("[resume-safe]") for line in lines)


@pytest.mark.parametrize("path", sorted(Path(__file__).resolve().parents[1].glob("experiments/*.yaml")),
                         ids=lambda p: p.name)
def test_every_experiment_file_is_a_valid_config(path):
    """Each file under experiments/ loads as what it is (a comparison, a sweep or one run), so a file the
    docs give a command for fails here, not when a user runs it."""
    import yaml

    from exgrpo.sweep.space import load_sweep

    data = yaml.safe_load(path.read_text())
    if "arms" in data:
        assert load_compare(path).arms
    elif "study" in data:
        assert load_sweep(path).space
    else:
        assert load_experiment(path).name
