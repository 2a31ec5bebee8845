"""What the vLLM rollout's tests share: the job environment (``make job-env`` -> .venv-job) and the
CLI run on vLLM in it.

Without the job environment the tests skip, unless ``EXGRPO_REQUIRE_JOB_ENV`` is set (CI), where
they fail."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import verlutil
from verlutil import EXGRPO, GRPO  # noqa: F401  (the same configs, re-exported for the vLLM tests)

ROOT = Path(__file__).resolve().parents[1]
JOB_PY = ROOT / ".venv-job" / "bin" / "python"
VLLM = ["--set=backend.verl.rollout=vllm", f"--set=backend.verl.python={JOB_PY}"]


def require_job_env() -> None:
    """Skip the calling module without the job environment (fail in CI, where it must be built)."""
    if not JOB_PY.exists() and not os.environ.get("EXGRPO_REQUIRE_JOB_ENV"):
        pytest.skip(f"no job environment at {JOB_PY}: run `make job-env`; set EXGRPO_REQUIRE_JOB_ENV=1 to make "
                    "this a failure", allow_module_level=True)


def _train(config, out, cache, *extra, timeout=900, check=True):
    """`exgrpo train` piped, on veRL's vLLM rollout in the job environment."""
    return verlutil._train(config, out, cache, *VLLM, *extra, check=check, timeout=timeout)


def _rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "batch/solved" in r]
