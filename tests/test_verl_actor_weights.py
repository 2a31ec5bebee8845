"""Reading a veRL actor's FSDP shards: merged across ranks with weights_only loads. The one-rank case
on a real veRL checkpoint is in test_verl_grpo_run.py; here two real FSDP2 ranks (gloo, CPU) shard a
model with uneven row counts, as 8 GPUs shard the paper's model."""

import json

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from exgrpo.backends.verl.actor_weights import actor_state_dict, is_step_dir

WORLD = 2


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))  # 7 and 3 rows: uneven over 2 ranks


def _shard_and_save(rank: int, init_file: str, actor_dir: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        model = _model()
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=init_device_mesh("cpu", (WORLD,)))
        fully_shard(model, mesh=init_device_mesh("cpu", (WORLD,)))
        torch.save(model.state_dict(), f"{actor_dir}/model_world_size_{WORLD}_rank_{rank}.pt")  # as veRL saves it
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # starts two torch.distributed ranks
def test_two_fsdp2_ranks_merge_to_the_full_model_and_a_missing_rank_is_named(tmp_path):
    step_dir = tmp_path / "checkpoints" / "global_step_4"
    actor = step_dir / "actor"
    actor.mkdir(parents=True)
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": WORLD}))
    mp.spawn(_shard_and_save, args=(str(tmp_path / "pg-init"), str(actor)), nprocs=WORLD, join=True)
    import torch.distributed.tensor  # DTensor loads weights_only

    rank0 = torch.load(actor / f"model_world_size_{WORLD}_rank_0.pt", weights_only=True)
    assert tuple(rank0["0.weight"].to_local().shape) == (4, 5)  # really sharded: 7 rows as 4 + 3

    assert is_step_dir(step_dir)
    merged = actor_state_dict(step_dir)
    full = _model().state_dict()
    assert set(merged) == set(full)
    for key, value in full.items():
        assert type(merged[key]) is torch.Tensor and torch.equal(merged[key], value), key

    (actor / f"model_world_size_{WORLD}_rank_1.pt").unlink()
    with pytest.raises(FileNotFoundError, match=r"model_world_size_2_rank_1\.pt.*missing"):
        actor_state_dict(step_dir)
    assert not is_step_dir(tmp_path)


def _external_step_dir(tmp_path, ranks_written):
    """A paper-tier (backend.verl.model_path) checkpoint of 8 FSDP ranks of which ``ranks_written`` exist."""
    from exgrpo.config import load_experiment

    cfg = load_experiment("experiments/paper-exgrpo.yaml")
    step_dir = tmp_path / "checkpoints" / "global_step_50"
    (step_dir / "actor").mkdir(parents=True)
    (step_dir / "actor" / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 8}))
    for r in ranks_written:
        (step_dir / "actor" / f"model_world_size_8_rank_{r}.pt").write_bytes(b"not loaded")
    (tmp_path / "verl_run.json").write_text(json.dumps({"config": json.loads(cfg.model_dump_json()), "overrides": []}))
    return step_dir


def _eval(step_dir, *extra):
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "exgrpo.cli", "eval", "--checkpoint", str(step_dir), "--no-tracking", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_an_external_models_checkpoint_with_a_missing_shard_is_one_line_before_any_work(tmp_path):
    """An external model's checkpoint is merged for vLLM; a rank's shard missing (or empty) is named in one
    line, exit 2, before any shard is read or anything is written."""
    step_dir = _external_step_dir(tmp_path, ranks_written=[0, 1, 2, 3, 4, 5, 7])
    (step_dir / "actor" / "model_world_size_8_rank_7.pt").write_bytes(b"")
    res = _eval(step_dir)
    assert res.returncode == 2, res.stderr[-2000:]
    (line,) = res.stderr.strip().splitlines()
    assert "model_world_size_8_rank_6.pt" in line and "model_world_size_8_rank_7.pt" in line, line
    assert line.startswith(f"error: --checkpoint {step_dir}: actor shards "), line
    assert sorted(p.name for p in step_dir.parent.iterdir()) == ["global_step_50"]  # nothing merged


def test_an_external_models_checkpoint_without_vllm_is_one_line_before_any_work(tmp_path):
    """Scoring an external model needs the job environment's vLLM: an interpreter without it is named
    in one line, exit 2, before the shards are merged."""
    step_dir = _external_step_dir(tmp_path, ranks_written=range(8))
    import sys

    res = _eval(step_dir, "--python", sys.executable)
    assert res.returncode == 2, res.stderr[-2000:]
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith(f"error: --python {sys.executable} has no vLLM") and "make job-env" in line, line
    assert sorted(p.name for p in step_dir.parent.iterdir()) == ["global_step_50"]
