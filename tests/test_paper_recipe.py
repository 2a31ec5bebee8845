"""The paper tier against the reference's recipe.

A vLLM run's model must hold the recipe's prompt plus response.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exgrpo.config import ConfigError, load_experiment

ROOT = Path(__file__).resolve().parent.parent
PAPER = ROOT / "experiments" / "paper-exgrpo.yaml"


def test_a_model_too_short_for_prompt_and_response_is_refused_in_one_line_before_any_work(tmp_path):
    """veRL sizes vLLM's context from the model's config: a shorter model would cut every response."""
    from exgrpo.backends.verl.assets import check_model_context
    from exgrpo.backends.verl.runner import prepare

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen2", "max_position_embeddings": 4096}')
    out = tmp_path / "runs"
    cfg = load_experiment(PAPER, {"backend.verl.model_path": str(model), "output_dir": str(out),
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
