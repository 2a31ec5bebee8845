"""A run resumes only from its own checkpoints; a fresh run never
mixes with an earlier one."""

import json
import subprocess
import sys

import pytest

from exgrpo.backends.native.trainer import Trainer
from exgrpo.config import load_experiment
from exgrpo.runs import SAFE_TO_CHANGE, ResumeMismatch, run_identity_diff

SMALL = {"task.max_operand": 5, "policy.hidden": 16, "policy.layers": 1, "algorithm.group_size": 4,
         "train.batch_size": 16, "train.max_steps": 4, "train.checkpoint_every": 2}


def cfg(tmp_path, **extra):
    return load_experiment("experiments/toy-exgrpo.yaml", {**SMALL, "output_dir": str(tmp_path), **extra})


def test_resume_refuses_a_checkpoint_made_with_another_config(tmp_path):
    Trainer(cfg(tmp_path)).fit(progress=False, stop_after_step=2)
    with pytest.raises(ResumeMismatch, match=r"train.lr \(0.0003 -> 0.01\).*--force-resume"):
        Trainer(cfg(tmp_path, **{"train.lr": 1e-2})).fit(progress=False, resume=True)
    # budget fields may change; the run continues
    res = Trainer(cfg(tmp_path, **{"train.max_steps": 6})).fit(progress=False, resume=True)
    assert res.history[-1]["step"] == 6
    # forcing is explicit
    Trainer(cfg(tmp_path, **{"train.max_steps": 8, "train.lr": 1e-2})).fit(progress=False, resume=True, force_resume=True)


@pytest.mark.slow
def test_cli_resume_mismatch_is_one_line(tmp_path):
    base = [sys.executable, "-m", "exgrpo.cli", "train", "experiments/toy-exgrpo.yaml", "--no-progress",
            "--output-dir", str(tmp_path), *[f"--set={k}={v}" for k, v in SMALL.items()]]
    assert subprocess.run(base, capture_output=True, text=True).returncode == 0
    out = subprocess.run([*base, "--resume", "--set=algorithm.experience_ratio=0.25"], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "algorithm.experience_ratio (0.5 -> 0.25)" in out.stderr


def test_fresh_run_moves_an_earlier_run_aside(tmp_path, capsys):
    from exgrpo.backends.base import train

    c = cfg(tmp_path)
    Trainer(c).fit(progress=False)
    first = (c.run_dir() / "metrics.jsonl").read_text()
    again = cfg(tmp_path, seed=0, **{"train.max_steps": 2})
    with pytest.raises(FileExistsError, match="holds an earlier run"):
        Trainer(again).fit(progress=False)  # a backend never moves a run aside itself: the launcher decides
    train(again, progress=False)  # the one entry point of the CLI, flows and comparisons
    assert "moved it to" in capsys.readouterr().out
    old = [p for p in c.run_dir().parent.iterdir() if p.name.startswith("seed0.old-")]
    assert len(old) == 1 and (old[0] / "metrics.jsonl").read_text() == first  # nothing lost
    ckpts = sorted(p.name for p in (c.run_dir() / "checkpoints").iterdir())
    assert ckpts == ["step_0000002.pt"]  # no stale checkpoint from the earlier run
    rows = [json.loads(x) for x in (c.run_dir() / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]


def test_identity_ignores_safe_fields_only():
    a = {"train": {"lr": 1.0, "max_steps": 5}, "output_dir": "a"}
    assert run_identity_diff(a, {"train": {"lr": 1.0, "max_steps": 9}, "output_dir": "b"}) == []
    assert run_identity_diff(a, {"train": {"lr": 2.0, "max_steps": 5}, "output_dir": "a"}) == ["train.lr (1.0 -> 2.0)"]


def test_safe_fields_are_the_marked_ones():
    """The config's RESUME_SAFE markers decide, in every union member: budget, cadence, places, and
    speed settings (the same computation up to rounding); never what the run computes."""
    assert {"train.max_steps", "train.threads", "output_dir", "backend.verl.launch", "policy.decoder",
            "policy.prepack_weights", "train.fused_optimizer", "train.log_every_steps"} <= SAFE_TO_CHANGE
    assert not {"train.lr", "seed", "policy.temperature", "policy.max_new_tokens", "algorithm.experience_ratio",
                "policy.model.hidden_size", "task.n_train"} & SAFE_TO_CHANGE
    lm = {"tier": "tiny-lm", "policy": {"kind": "lm", "decoder": "static-kv", "temperature": 1.0}}
    changed = {"tier": "tiny-lm", "policy": {"kind": "lm", "decoder": "fused", "temperature": 1.0}}
    assert run_identity_diff(lm, changed) == []
