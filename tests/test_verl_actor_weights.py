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


def test_a_checkpoint_of_an_external_model_is_refused_before_its_shards_are_read(tmp_path):
    """The paper tier trains backend.verl.model_path (an HF model exgrpo does not rebuild): one line
    names the model and veRL's merger instead of a key-mismatch trace."""
    from exgrpo.backends.verl.actor_weights import policy_state
    from exgrpo.config import load_experiment

    cfg = load_experiment("experiments/paper-exgrpo.yaml")
    step_dir = tmp_path / "checkpoints" / "global_step_50"
    (step_dir / "actor").mkdir(parents=True)
    (step_dir / "actor" / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 8}))
    (tmp_path / "verl_run.json").write_text(json.dumps({"config": json.loads(cfg.model_dump_json()), "overrides": []}))
    with pytest.raises(ValueError, match=r"actor of models/Qwen2\.5-Math-1\.5B-16k \(backend\.verl\.model_path\).*model_merger"):
        policy_state(step_dir)
