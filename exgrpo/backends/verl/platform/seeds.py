"""The seed of one rollout request, shared by the ``hf`` and the vLLM rollout servers.

veRL's agent loop sends a step's samples as concurrent requests that reach a server in an order that
changes from run to run. Under ``rollout.full_determinism`` it names each request ``det-<row>`` by its
row in the step's batch, so a seed keyed by (run seed, weight version, row) follows the row, whatever
the arrival order, the replica that answers it, or its batch-mates.
"""

from __future__ import annotations

import zlib

import numpy as np

DET_PREFIX = "det-"
"""veRL's request-id prefix under ``rollout.full_determinism`` (``det-<row>``)."""


def request_row(request_id: str) -> int:
    """The request's row in the step's batch (``det-<row>``); any other id is hashed, stably across
    processes (unlike ``hash``), so it still gets a seed, but one that no other run repeats."""
    tail = request_id[len(DET_PREFIX):]
    return int(tail) if request_id.startswith(DET_PREFIX) and tail.isdigit() else zlib.crc32(request_id.encode())


def request_seed(seed: int, weight_version: int, request_id: str) -> int:
    """The seed of one request: (run seed, weight version, the request's row), mixed by numpy's
    SeedSequence into a non-negative 63-bit integer (what ``torch.Generator.manual_seed`` and vLLM's
    ``SamplingParams.seed`` take). Neighbouring keys give unrelated streams: row 1 of step 2 shares
    nothing with row 2 of step 1, nor the K samples of one question with each other."""
    key = [int(seed), int(weight_version), request_row(request_id)]
    if min(key) < 0:
        raise ValueError(f"request seed key must be non-negative (seed, weight version, row), got {key}")
    return int(np.random.SeedSequence(key).generate_state(1, dtype=np.uint64)[0] >> 1)
