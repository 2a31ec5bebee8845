"""An ``hf`` rollout for veRL 0.9.1's server-mode agent loop: a Hugging Face model on the CPU.

Three pieces, as veRL's vLLM rollout has them:

* :class:`HFRolloutServer`, a Ray actor per replica. The agent loop sends it one prompt per
  request, many at once. It samples them with the KV-cache engine the native backend uses
  (:class:`exgrpo.policies.lm.engine.RolloutEngine`), returning token ids and their
  log-probs (``rollout_log_probs``: the behaviour log-probs replay needs), in one of two ways:

  - *reproducible* (the default): each request alone, from a generator seeded by (run seed,
    weight version, the request's row in the step's batch: veRL's ``det-<row>`` request id under
    ``rollout.full_determinism``). Neither arrival order nor batch-mates change a row's tokens or
    log-probs, so one seed gives the same run bit for bit;
  - *batched*: the requests that arrive within a few milliseconds as one batch from one generator:
    faster, but which requests share a batch depends on timing, and so do the samples.
* :class:`HFReplica` (``RolloutReplicaRegistry["hf"]``) launches that actor.
* :class:`HFServerAdapter` (``_ROLLOUT_REGISTRY[("hf", "async")]``) lives in the actor worker and
  pushes the trained weights to the server after every update.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Generator
from typing import Any

import ray
import torch

from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

from exgrpo.backends.verl.platform.seeds import DET_PREFIX, request_seed
from exgrpo.policies.lm.engine import RolloutEngine, SamplingParams

logger = logging.getLogger(__name__)

BATCH_WINDOW_SECONDS = 0.01
"""How long the server waits for more concurrent requests before it generates a batch."""


def server_name(replica_rank: int) -> str:
    return f"exgrpo_hf_server_{replica_rank}"


class HFRolloutServer:
    """Token-in, token-out generation for one replica (a Ray actor with async methods)."""

    def __init__(self, model_path: str, response_length: int, prompt_length: int, seed: int = 0,
                 threads: int = 1, engine: dict[str, Any] | None = None, reproducible: bool = False) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(threads)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        tok = AutoTokenizer.from_pretrained(model_path)
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.eos_id = tok.eos_token_id
        self.response_length = response_length
        self.prompt_length = prompt_length
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)
        self.reproducible = reproducible
        self._warned_ids = False
        self.weight_version = 0
        """``global_steps`` of the last weight sync: part of every reproducible request's seed."""
        self.engine_options = _engine_options(engine or {})
        """RolloutEngine's decoder/prepack, from the policy's ``decoder`` / ``prepack_weights`` (the
        engine's own defaults for what is not given)."""
        self._pending: list[tuple[list[int], dict[str, Any], asyncio.Future]] = []
        self._flush: asyncio.Task | None = None
        self._lock: asyncio.Lock | None = None
        self.batches: list[int] = []
        """Size of every generated batch (for tests and the bench)."""

    # ---------------------------------------------------------------- generation
    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data: Any = None, video_data: Any = None, **kwargs: Any) -> TokenOutput:
        if self.reproducible:
            return await self._generate_alone(request_id, list(prompt_ids), dict(sampling_params))
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((list(prompt_ids), dict(sampling_params), fut))
        if self._flush is None or self._flush.done():
            self._flush = asyncio.create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        if self._lock is None:
            self._lock = asyncio.Lock()
        await asyncio.sleep(BATCH_WINDOW_SECONDS)
        async with self._lock:
            while self._pending:
                batch, self._pending = self._pending, []
                groups: dict[tuple, list] = {}
                for item in batch:
                    groups.setdefault(_params_key(item[1], self.response_length), []).append(item)
                for key, items in groups.items():
                    try:
                        outs = await asyncio.to_thread(self._generate, [p for p, _, _ in items], key)
                        for (_, _, fut), out in zip(items, outs, strict=True):
                            fut.set_result(out)
                    except Exception as exc:  # every waiting request sees the failure
                        for _, _, fut in items:
                            if not fut.done():
                                fut.set_exception(exc)

    async def _generate_alone(self, request_id: str, prompt: list[int], sampling_params: dict[str, Any]) -> TokenOutput:
        if self._lock is None:
            self._lock = asyncio.Lock()
        if not request_id.startswith(DET_PREFIX) and not self._warned_ids:
            self._warned_ids = True
            logger.warning("hf rollout: request id %r is not veRL's det-<row> (rollout.full_determinism off?): "
                           "samples are seeded by the id and the run is not reproducible", request_id)
        generator = torch.Generator().manual_seed(request_seed(self.seed, self.weight_version, request_id))
        async with self._lock:  # one request at a time, so no other row shares its batch
            outs = await asyncio.to_thread(self._generate, [prompt], _params_key(sampling_params, self.response_length),
                                           generator)
        return outs[0]

    @torch.no_grad()
    def _generate(self, prompts: list[list[int]], key: tuple, generator: torch.Generator | None = None) -> list[TokenOutput]:
        temperature, top_p, max_tokens = key
        greedy = temperature <= 0
        params = SamplingParams(max_new_tokens=max_tokens, temperature=1.0 if greedy else temperature, top_p=top_p)
        engine = RolloutEngine(self.model, self.pad_id, self.eos_id, params, **self.engine_options)
        out = engine.generate(prompts, generator or self.generator, greedy=greedy)
        self.batches.append(len(prompts))
        results = []
        for i in range(len(prompts)):
            n = int(out.mask[i].sum())
            results.append(TokenOutput(
                token_ids=out.tokens[i, :n].tolist(), log_probs=out.log_prob[i, :n].tolist(),
                stop_reason="completed",
            ))
        return results

    # ---------------------------------------------------------------- weights and lifecycle
    async def update_weights(self, state: dict[str, torch.Tensor], global_steps: int | None = None) -> int:
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected:
            raise KeyError(f"hf rollout: unexpected weights {unexpected[:5]}")
        # the step the weights are of; without it (a caller that does not say), count the syncs
        self.weight_version = int(global_steps) if global_steps is not None else self.weight_version + 1
        return len(state)

    async def batch_sizes(self) -> list[int]:
        return list(self.batches)

    async def wake_up(self) -> None: ...
    async def sleep(self) -> None: ...
    async def clear_kv_cache(self) -> None: ...
    async def release_kv_cache(self) -> None: ...
    async def resume_kv_cache(self) -> None: ...
    async def abort_all_requests(self, reject_request: bool = False) -> None: ...
    async def resume_generation(self) -> None: ...
    async def start_profile(self, **kwargs: Any) -> None: ...
    async def stop_profile(self) -> None: ...


def _engine_options(policy: dict[str, Any]) -> dict[str, Any]:
    """``rollout.custom`` (the policy's ``decoder`` / ``prepack_weights``) -> RolloutEngine keywords."""
    names = {"decoder": "decoder", "prepack_weights": "prepack"}  # "reproducible" is the server's own
    return {names[k]: v for k, v in policy.items() if k in names}


def _params_key(sp: dict[str, Any], response_length: int) -> tuple[float, float, int]:
    max_tokens = sp.get("max_tokens") or sp.get("max_new_tokens") or response_length
    top_p = float(sp.get("top_p", 1.0) or 1.0)
    return float(sp.get("temperature", 1.0)), top_p, int(min(max_tokens, response_length))


class HFReplica(RolloutReplica):
    """One :class:`HFRolloutServer` per replica, on the CPU (it takes no logical GPU)."""

    def rollout_worker_use_gpu(self) -> bool:
        return False

    async def launch_servers(self) -> None:
        from verl.utils.config import omega_conf_to_dataclass

        cfg = self.config
        model_config = self.model_config
        if not hasattr(model_config, "local_path"):
            model_config = omega_conf_to_dataclass(model_config)
        name = server_name(self.replica_rank)
        custom = dict(getattr(cfg, "custom", None) or {})
        reproducible = bool(custom.get("reproducible", False))
        server = ray.remote(HFRolloutServer).options(
            name=name, num_cpus=0, max_concurrency=self.max_concurrency,
        ).remote(
            model_config.local_path, int(cfg.response_length), int(cfg.prompt_length),
            # reproducible: one seed for every replica (veRL routes a row to a replica by Python's
            # per-process string hash, so which replica answers a row changes from run to run)
            seed=int(os.environ.get("EXGRPO_SEED", "0")) + (0 if reproducible else self.replica_rank),
            engine=custom,  # rollout.custom: the policy's decoder settings (overrides.py)
            reproducible=reproducible,
        )
        self.servers = [server]
        self._server_handle = server
        self._server_address = name


class HFServerAdapter(BaseRollout):
    """Worker side: sends the actor's weights to this replica's server after each update."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1) -> None:
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        world = int(self.config.tensor_model_parallel_size * self.config.data_parallel_size
                    * self.config.pipeline_model_parallel_size)
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.is_leader = rank % world == 0
        self._server = None

    async def resume(self, tags: list[str]) -> None: ...

    async def release(self) -> None: ...

    async def update_weights(self, weights: Generator[tuple[str, torch.Tensor], None, None],
                             wire_format: str = "named_tensors", **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise ValueError(f"hf rollout supports wire_format='named_tensors', got {wire_format!r}")
        state = {name: t.detach().to("cpu", copy=True) for name, t in weights}  # every rank must drain
        if not self.is_leader:
            return
        if self._server is None:
            self._server = ray.get_actor(server_name(self.replica_rank))
        await self._server.update_weights.remote(state, kwargs.get("global_steps"))
