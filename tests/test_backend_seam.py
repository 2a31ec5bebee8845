"""Evaluation and recording read a checkpoint through the backend seam (exgrpo.backends.base): a backend
that registers how to read its checkpoints needs no change in either. The "other" backend here is a
real registry entry whose checkpoints are ``*.other`` directories holding the common policy entries."""

from pathlib import Path

import pytest
import torch

from exgrpo.backends.base import register_backend
from exgrpo.backends.native.trainer import Trainer
from exgrpo.config import load_experiment
from exgrpo.evaluation.runner import load_checkpoint_policy, read_checkpoint, score_checkpoint
from exgrpo.policies.build import build_task_and_policy
from exgrpo.tracking.finished_run import policy_checkpoint


class OtherBackend:
    """A checkpoint is a ``*.other`` directory; its policy file is the ``policy.pt`` inside."""

    name = "other"
    reports_to_mlflow = False

    def read_checkpoint(self, path: Path):
        return torch.load(path / "policy.pt", weights_only=True) if path.suffix == ".other" else None

    def policy_file(self, checkpoint: Path):
        return checkpoint / "policy.pt" if checkpoint.suffix == ".other" else None

    def build_policy(self, cfg):
        return build_task_and_policy(cfg)


OTHER = OtherBackend()


@pytest.fixture
def other_checkpoint(tmp_path):
    unregister = register_backend("other", f"{__name__}:OTHER")
    cfg = load_experiment("experiments/toy.yaml", {"task.max_operand": 5, "output_dir": str(tmp_path / "runs")})
    _, policy = build_task_and_policy(cfg)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    path = tmp_path / "step_7.other"
    path.mkdir()
    torch.save({"config": cfg.model_dump_json(), "model": policy.state_dict(), "step": 7}, path / "policy.pt")
    yield cfg, policy, path
    unregister()


def test_evaluation_and_recording_read_a_registered_backends_checkpoint(other_checkpoint):
    cfg, policy, path = other_checkpoint
    assert read_checkpoint(path)["step"] == 7
    loaded = load_checkpoint_policy(path)
    assert loaded.step == 7 and loaded.config == cfg
    assert all(torch.equal(a, b) for a, b in zip(loaded.policy.state_dict().values(), policy.state_dict().values(),
                                                   strict=True))
    assert policy_checkpoint(path) == path / "policy.pt"


def test_evaluating_a_checkpoint_scores_as_the_trainer_evaluates(other_checkpoint):
    """score_checkpoint (exgrpo eval, the evaluate flow, a finished run's record) with no benchmark named
    gives the run's own greedy evaluation, under eval/<benchmark>/<metric> names."""
    cfg, policy, path = other_checkpoint
    task, _ = build_task_and_policy(cfg)
    own = Trainer(cfg, task, policy).evaluate()
    scores = {s.key: s.value for s in score_checkpoint(path).scores}
    assert scores == pytest.approx({"val/avg_at_1": own["val/accuracy"], "val/pass_at_1": own["val/accuracy"],
                                    "train/avg_at_1": own["train/accuracy"], "train/pass_at_1": own["train/accuracy"]},
                                   abs=1e-7)  # the trainer averages in float32


def test_evaluating_a_checkpoint_runs_on_its_thread_count_and_gives_the_callers_back(monkeypatch):
    from exgrpo.evaluation import runner

    cfg = load_experiment("experiments/toy.yaml", {"train.threads": 2})
    loaded = runner.CheckpointPolicy(cfg, task=None, policy=None, step=0)
    seen = []

    def score_policy(loaded, spec, settings, workers):
        seen.append(torch.get_num_threads())
        if len(seen) == 2:
            raise RuntimeError("evaluation failed")
        return ["scored"]

    monkeypatch.setattr(runner, "_score_policy", score_policy)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert score_checkpoint(loaded).scores == ["scored"]
        assert torch.get_num_threads() == 1
        with pytest.raises(RuntimeError, match="evaluation failed"):
            score_checkpoint(loaded)
        assert torch.get_num_threads() == 1 and seen == [2, 2]
    finally:
        torch.set_num_threads(threads)


def test_a_path_no_backend_reads_is_a_one_line_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_checkpoint(tmp_path / "missing.pt")
    with pytest.raises(FileNotFoundError, match="a directory that is not a veRL checkpoint"):
        read_checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError, match="is a directory but not a veRL checkpoint"):
        policy_checkpoint(tmp_path)


def test_each_backend_refuses_a_resume_it_would_not_go_on_with_before_anything_is_built(tmp_path):
    """The launcher asks the backend (``check_resumable``) before it opens a run's record: veRL reads the
    run's spec, the native backend its newest checkpoint (tensors mapped, not loaded)."""
    import json

    from exgrpo.backends.base import check_resumable
    from exgrpo.backends.verl.prepared import SPEC_FILE
    from exgrpo.runs import ResumeMismatch

    out = {"output_dir": str(tmp_path / "runs")}
    verl = load_experiment("experiments/verl-tiny-exgrpo.yaml", out)
    with pytest.raises(FileNotFoundError, match="holds no veRL run"):
        check_resumable(verl)
    verl.run_dir().mkdir(parents=True)
    (verl.run_dir() / SPEC_FILE).write_text(json.dumps({"config": json.loads(verl.model_dump_json())}))
    check_resumable(verl)
    other = load_experiment("experiments/verl-tiny-exgrpo.yaml", {**out, "train.lr": 0.5})
    with pytest.raises(ResumeMismatch, match=r"train.lr \(.* -> 0.5\)"):
        check_resumable(other)
    check_resumable(other, force_resume=True)

    native = load_experiment("experiments/toy.yaml", {**out, "task.max_operand": 5, "train.max_steps": 2})
    Trainer(native).fit(progress=False)
    check_resumable(native)
    with pytest.raises(ResumeMismatch, match=r"train.lr \(.* -> 0.5\)"):
        check_resumable(native.model_copy(update={"train": native.train.model_copy(update={"lr": 0.5})}))
