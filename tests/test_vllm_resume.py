"""ExGRPO on veRL's vLLM rollout (the job environment, through the CLI): replayed slots skipped by
the rollout, the stored trajectories in the batch, a real SIGKILL and a resume with the pool."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from vllmutil import EXGRPO, VLLM, _rows, require_job_env

require_job_env()


@pytest.mark.slow
def test_vllm_exgrpo_replays_and_a_killed_run_resumes_with_its_pool(tmp_path, exgrpo_cache):
    """ExGRPO on vLLM: replayed slots are skipped by the rollout and the stored trajectories enter
    the batch with their behaviour log-probs; SIGKILLed after its first checkpoint, the run resumes
    with its pool and validates through vLLM."""
    import signal

    import torch

    # untracked: nothing here reads MLflow, and a tracked run's end adds a final evaluation and a logged model
    extra = [*VLLM, "--set=train.max_steps=4", "--set=train.checkpoint_every=2", "--set=train.eval_every_steps=4",
             "--no-tracking"]
    cmd = [sys.executable, "-m", "exgrpo.cli", "train", EXGRPO, "--no-progress", "--output-dir", str(tmp_path), *extra]
    env = {**os.environ, "EXGRPO_CACHE": str(exgrpo_cache)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    run_dir = tmp_path / "verl-tiny-exgrpo" / "seed0"
    tracker = run_dir / "checkpoints" / "latest_checkpointed_iteration.txt"
    raw = run_dir / "verl_metrics" / "attempt_000.jsonl"

    def recorded() -> set[int]:  # the steps whose metrics row the job has written
        lines = raw.read_text().split("\n")[:-1] if raw.exists() else []  # whole lines: each ends in a newline
        return {json.loads(x)["step"] for x in lines if x.strip()}

    try:
        deadline = time.monotonic() + 600
        # killed once the checkpointed step's row is written too: veRL logs a step's row after saving its
        # checkpoint, and a kill between the two loses that row (a known gap: CHANGELOG)
        while (time.monotonic() < deadline and proc.poll() is None
               and not (tracker.exists() and int(tracker.read_text()) in recorded())):
            time.sleep(0.2)
        assert tracker.exists(), "no checkpoint before the kill"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    saved = int(tracker.read_text())
    killed_at = torch.load(run_dir / "checkpoints" / f"global_step_{saved}" / "exgrpo_pool.pt", weights_only=True)
    res = subprocess.run([*cmd[:-len(extra)], *extra, "--resume"], env=env, capture_output=True, text=True,
                         timeout=900, start_new_session=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"exgrpo: resumed at step {saved} from " in (run_dir / "verl.log").read_text()
    rows = {int(r["step"]): r for r in _rows(run_dir)}
    assert sorted(rows) == [1, 2, 3, 4]
    resumed = rows[saved + 1]
    assert resumed["pool/retired"] >= len(killed_at["replay"]["pool"]["retired"])
    assert max(r["replay/questions"] for r in rows.values()) > 0
    assert max(r["actor/off_token_fraction"] for r in rows.values()) > 0
    assert all(r["rollout/generated_rows"] == 16 * 4 - r["replay/questions"] for r in rows.values())
    replaying = [r for r in rows.values() if r["actor/off_token_fraction"] > 0]
    assert all(0.5 < r["actor/off_ratio_mean"] < 2.0 for r in replaying)  # behaviour log-probs restored
    val = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [int(r["step"]) for r in val if "val/accuracy" in r] == [4]
