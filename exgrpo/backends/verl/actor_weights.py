"""The policy in a veRL checkpoint, read without veRL and without unpickling code.

A veRL step directory ``<run_dir>/checkpoints/global_step_N/`` holds the actor's weights as FSDP
shards, ``actor/model_world_size_<W>_rank_<r>.pt`` (one per rank; each a state dict of DTensors
sharded along one mesh dimension), next to ``actor/fsdp_config.json`` (``world_size``). Our config
is in the run's ``verl_run.json``. :func:`policy_state` merges the shards into the HF model's full
state dict and returns it in the native checkpoint's format (``config``, ``model``, ``step``), so
everything that reads a native checkpoint (``exgrpo eval``, the evaluate flow, a sweep's registered
champion) reads a veRL one the same way.

Every file is loaded with ``torch.load(weights_only=True)``: veRL's own ``model_merger`` uses
``weights_only=False``, which would run whatever a tampered checkpoint holds.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import torch

from exgrpo.backends.verl.prepared import SPEC_FILE, spec_model

_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def is_step_dir(path: str | Path) -> bool:
    """True for a veRL checkpoint step directory (``global_step_N`` with FSDP actor shards)."""
    path = Path(path)
    return bool(_STEP_DIR.match(path.name)) and (path / "actor" / "fsdp_config.json").is_file()


def merge_shards(shards: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Per-rank FSDP state dicts (rank order) -> one full state dict of plain tensors.

    A DTensor sharded on dimension d is the concatenation of the ranks' local pieces along d (FSDP2
    splits like ``torch.chunk``); a replicated one is rank 0's; plain tensors are taken as they are."""
    from torch.distributed.tensor import DTensor

    merged: dict[str, torch.Tensor] = {}
    for key, first in shards[0].items():
        if not isinstance(first, DTensor):
            merged[key] = first
            continue
        if len(first.placements) != 1:
            raise ValueError(f"{key}: sharded on a {len(first.placements)}-D device mesh; only FSDP's 1-D mesh is read")
        placement = first.placements[0]
        if placement.is_replicate():
            merged[key] = first.to_local()
        elif placement.is_shard():
            merged[key] = torch.cat([s[key].to_local() for s in shards], dim=placement.dim)
        else:
            raise ValueError(f"{key}: placement {placement} is neither a shard nor a replica")
        if tuple(merged[key].shape) != tuple(first.shape):
            raise ValueError(f"{key}: the shards add up to {tuple(merged[key].shape)}, not {tuple(first.shape)}")
    return merged


def actor_state_dict(step_dir: str | Path) -> dict[str, torch.Tensor]:
    """The actor's full HF state dict from ``step_dir``'s FSDP shards (``weights_only`` loads)."""
    import torch.distributed.tensor  # registers DTensor for weights_only loading

    actor = Path(step_dir) / "actor"
    world = int(json.loads((actor / "fsdp_config.json").read_text())["world_size"])
    files = [actor / f"model_world_size_{world}_rank_{r}.pt" for r in range(world)]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"{step_dir}: actor shards {missing} are missing (world size {world})")
    mesh_log = logging.getLogger("torch.distributed.device_mesh")
    level = mesh_log.level
    mesh_log.setLevel(logging.ERROR)  # unpickling a DeviceMesh outside a process group warns; it is only read
    try:
        return merge_shards([torch.load(f, map_location="cpu", weights_only=True) for f in files])
    finally:
        mesh_log.setLevel(level)


def policy_state(step_dir: str | Path) -> dict[str, Any]:
    """``{"config", "model", "step", "verl_checkpoint"}`` of a veRL step directory: the native
    checkpoint's policy entries (:func:`exgrpo.backends.native.checkpoint.load_state`'s format),
    the config being the run's own (``<run_dir>/verl_run.json``) and ``model`` keyed as the native
    LM policy's state dict (the HF model is its ``model`` attribute)."""
    step_dir = Path(step_dir).resolve()
    if not is_step_dir(step_dir):
        raise ValueError(f"{step_dir} is not a veRL checkpoint (global_step_N/ with actor/fsdp_config.json)")
    spec = step_dir.parent.parent / SPEC_FILE
    if not spec.is_file():
        raise FileNotFoundError(f"{step_dir}: the run's {SPEC_FILE} is not at {spec} (the config of the run that "
                                "wrote this checkpoint)")
    saved = json.loads(spec.read_text())
    config = saved["config"]  # the run's ExperimentConfig, as JSON
    external = spec_model(saved)
    if external:
        raise ValueError(f"{step_dir} holds the actor of {external} (an external HF model), which exgrpo does not "
                         "rebuild as a policy; `exgrpo eval --checkpoint` scores it with vLLM from its HF directory")
    return {
        "config": json.dumps(config),
        "model": {f"model.{k}": v for k, v in actor_state_dict(step_dir).items()},
        "step": int(_STEP_DIR.match(step_dir.name).group(1)),
        "verl_checkpoint": str(step_dir),
    }
