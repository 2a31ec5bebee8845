"""A veRL ExGRPO run on veRL's vLLM rollout (the job environment) killed for real and resumed with its
pool, and the importance ratio of the replayed tokens seen by veRL's actor update. One run serves every
test here: the fixture kills it, resumes it to its end, resumes it once more (nothing to train), then
shifts its stored behaviour log-probs and trains one step more; each test reads what was recorded at its
stage. Replay and the pool's checkpoint are the trainer's own, whatever rollout serves it: the vLLM one
is the rollout with the most processes for a kill to leave behind, and its replayed slots are skipped by
the engine (``rollout/generated_rows``)."""

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from exgrpo.atomic import torch_save_atomic
from exgrpo.backends.verl.checkpoints import HOLD_AFTER_CHECKPOINT_ENV, POOL_FILE

from verlutil import EXGRPO, _env, _rows, _train, _train_in_a_terminal
from vllmutil import VLLM, require_job_env

require_job_env()

# the lenient answer format: more early successes, so the pool holds trajectories to shift; a small
# KL toward the behaviour policy, whose value on the shifted tokens is known; validation (through vLLM) at
# the last step only. No MLflow: nothing here reads it, and each of the run's three ends would add a final
# evaluation.
KILL_RUN = [*VLLM, "--set=train.max_steps=6", "--set=train.checkpoint_every=2", "--set=train.keep_last=2",
            "--set=task.answer_format=boxed_or_last_number", "--set=algorithm.kl_coeff=0.001",
            "--set=train.eval_every_steps=6", "--no-tracking"]
DELTA = 1.0
"""How far every stored behaviour log-prob is lowered before the last step."""


def _checkpoints(run_dir):
    return sorted(p.name for p in (run_dir / "checkpoints").glob("global_step_*"))


def _steps(run_dir):
    return {int(r["step"]): r for r in _rows(run_dir) if "batch/solved" in r}


@pytest.fixture(scope="module")
def killed_exgrpo_run(tmp_path_factory, exgrpo_cache):
    """experiments/verl-tiny-exgrpo.yaml through the CLI, killed for real (SIGKILL to `exgrpo train`
    only, as `kill -9` does) in the window between its second checkpoint (step 4) and that step's
    metrics row: the job holds there (the trainer's fault-injection point), so the kill lands in it
    for sure. The processes it had started are watched until they are gone (at most 120 s). Then a
    torn newer checkpoint is planted as if the kill had hit the next save, a resume is refused for
    another config, the run resumes to the end (6 steps) in a terminal, from step 2 (step 4 has no
    row), and is resumed once more after its end. Last, every stored behaviour log-prob of its final
    checkpoint is lowered by DELTA and it trains a step 7. Returns what the tests look at, read at
    each stage."""
    import psutil

    out = tmp_path_factory.mktemp("verl-killed")
    cmd = [sys.executable, "-m", "exgrpo.cli", "train", EXGRPO, "--no-progress", "--output-dir", str(out), *KILL_RUN]
    proc = subprocess.Popen(cmd, env={**_env(exgrpo_cache), HOLD_AFTER_CHECKPOINT_ENV: "4"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    run_dir = out / "verl-tiny-exgrpo" / "seed0"
    ckpts = run_dir / "checkpoints"
    tracker = ckpts / "latest_checkpointed_iteration.txt"  # veRL writes it once a step is whole
    pool_4 = ckpts / "global_step_4" / POOL_FILE

    def holding() -> bool:  # step 4 saved whole (veRL's tracker names it): the job holds from here on
        return pool_4.is_file() and tracker.is_file() and tracker.read_text().strip() == "4"

    deadline = time.time() + 900
    while time.time() < deadline and proc.poll() is None and not holding():
        time.sleep(0.2)
    if not holding():
        with contextlib.suppress(ProcessLookupError):  # a failed wait leaves no run behind
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"no hold before the kill (exit {proc.returncode}); see {run_dir / 'verl.log'}")
    time.sleep(2)  # the tracker is written before the pool is pruned and the hold starts
    started = psutil.Process(proc.pid).children(recursive=True)
    at_kill = int(tracker.read_text())
    logged_at_kill = sorted(int(json.loads(x)["step"]) for x in (run_dir / "verl_metrics" / "attempt_000.jsonl")
                            .read_text().splitlines() if "training/global_step" in x)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    gone, outlived = psutil.wait_procs(started, timeout=120)
    with contextlib.suppress(ProcessLookupError):  # whatever outlived it, so that the resume starts clean
        os.killpg(proc.pid, signal.SIGKILL)
    saved = int(tracker.read_text())
    before = saved - 2  # the checkpoint before the unlogged one: what the resume must start from
    killed_at = torch.load(ckpts / f"global_step_{before}" / "exgrpo_pool.pt", weights_only=True)
    torn = ckpts / f"global_step_{saved + 1}" / "actor"  # as if killed in the middle of the next save
    torn.mkdir(parents=True)
    tracker.write_text(str(saved + 1))
    # it resumes only with its own config (checked before anything starts)
    refused = _train(EXGRPO, out, exgrpo_cache, *KILL_RUN, "--resume", "--set=train.lr=0.1", check=False)
    resumed = _train_in_a_terminal(EXGRPO, out, exgrpo_cache, *KILL_RUN, "--resume")  # as a person resumes it
    run = {"out": out, "run_dir": run_dir, "saved": saved, "before": before, "logged_at_kill": logged_at_kill,
           "killed_at": killed_at, "refused": refused,
           "resumed": resumed, "started": started, "checkpoint_at_kill": at_kill,
           "outlived": [f"{p.pid} {p.name()}" for p in outlived if p.is_running()],
           "log": (run_dir / "verl.log").read_text(), "checkpoints": _checkpoints(run_dir),
           "steps": _steps(run_dir), "validated": [int(r["step"]) for r in _rows(run_dir) if "val/accuracy" in r],
           "final_pool": torch.load(ckpts / "global_step_6" / "exgrpo_pool.pt", weights_only=True)}

    # resumed again once it has ended (as `exgrpo compare --resume` does with finished runs)
    again = _train(EXGRPO, out, exgrpo_cache, *KILL_RUN, "--resume")
    run["again"] = {"returncode": again.returncode, "log": (run_dir / "verl.log").read_text(),
                    "checkpoints": _checkpoints(run_dir), "last_step": max(_steps(run_dir))}

    pool_path = ckpts / "global_step_6" / "exgrpo_pool.pt"
    state = torch.load(pool_path, weights_only=True)
    assert len(state["replay"]["pool"]["qid"]), "nothing stored in six steps"
    state["replay"]["pool"]["behaviour_log_prob"] -= DELTA  # every stored token's behaviour log-prob
    torch_save_atomic(state, pool_path)
    _train(EXGRPO, out, exgrpo_cache, *KILL_RUN, "--set=train.max_steps=7", "--set=train.eval_every_steps=null",
           "--resume")
    run["shifted_step"] = _steps(run_dir)[7]
    return run


@pytest.mark.slow
def test_nothing_of_a_verl_run_outlives_a_kill_9_of_the_command(killed_exgrpo_run):
    """The veRL job notices its launcher is gone and stops its Ray: none of the processes the command
    had started (the job, Ray's GCS, raylet, workers) is left running, nor as a zombie, and the run
    trained no further (an orphaned job went on to its last step and checkpoint)."""
    run = killed_exgrpo_run
    assert len(run["started"]) >= 5  # the job, its Ray and veRL's workers were up at the kill
    assert run["outlived"] == []
    assert run["saved"] == run["checkpoint_at_kill"]


@pytest.mark.slow
def test_verl_exgrpo_killed_then_resumed_keeps_its_pool(killed_exgrpo_run):
    """A real SIGKILL between step 4's checkpoint and its metrics row, then `--resume`, past a torn
    newer checkpoint and past step 4 (no row: skipped, with a note) to step 2, with step 2's pool;
    every step has its row in the end, and the newest `train.keep_last` steps stay."""
    run = killed_exgrpo_run
    saved, before, killed_at, log, rows = run["saved"], run["before"], run["killed_at"], run["log"], run["steps"]
    assert saved == 4 and run["logged_at_kill"] == [1, 2, 3]  # killed inside the window
    assert run["refused"].returncode == 2 and "train.lr (1e-05 -> 0.1)" in run["refused"].stderr
    assert f"global_step_{saved + 1} is torn (no actor weights)" in log
    assert f"global_step_{saved} has no metrics row (the run was killed before veRL logged the step)" in log
    pool = killed_at["replay"]["pool"]
    resumed = f"exgrpo: resumed at step {before} from "
    assert resumed in log and f"restored with {len(pool['qid'])} questions (" in log
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", run["resumed"])  # the terminal says it too, above the bar
    assert resumed in shown, shown[-2000:]
    assert run["checkpoints"] == ["global_step_4", "global_step_6"]
    assert sorted(rows) == [1, 2, 3, 4, 5, 6]  # step 4 trained again, and logged this time
    assert run["validated"] == [6]  # through the resumed run's vLLM servers
    # the pool carried over: nothing retired before the checkpoint is forgotten
    assert rows[before + 1]["pool/retired"] >= len(killed_at["replay"]["pool"]["retired"])


@pytest.mark.slow
def test_a_verl_run_resumed_after_its_end_trains_nothing(killed_exgrpo_run):
    """Resumed once it has ended (as `exgrpo compare --resume` does with finished runs): nothing
    trains and no job starts; veRL's own loop would have trained a step 7 and saved global_step_7."""
    again = killed_exgrpo_run["again"]
    assert "exgrpo: the run already ended at step 6 of 6; nothing to train" in again["log"]
    assert again["checkpoints"] == ["global_step_4", "global_step_6"]
    assert again["last_step"] == 6 and again["returncode"] == 0


@pytest.mark.slow
def test_verl_exgrpo_replays_through_the_real_actor_loss(killed_exgrpo_run):
    rows = list(killed_exgrpo_run["steps"].values())
    # replayed rows reached the worker's loss with the mask set (these come from the actor, not the driver)
    assert max(r["replay/questions"] for r in rows) > 0
    assert max(r["actor/off_token_fraction"] for r in rows) > 0
    replaying = [r for r in rows if r["actor/off_token_fraction"] > 0]
    assert all(0.5 < r["actor/off_ratio_mean"] < 2.0 for r in replaying)  # w near 1: behaviour log-probs restored
    assert max(r["pool/questions"] for r in rows) > 0
    # the engine sampled K-1 rows of a replayed question: B*K minus one row per replayed question
    k, b = 4, 16
    assert all(r["rollout/generated_rows"] == b * k - r["replay/questions"] for r in rows)
    pool = killed_exgrpo_run["final_pool"]
    assert pool["step"] == 6 and len(pool["replay"]["pool"]["qid"]) == rows[-1]["pool/questions"]


@pytest.mark.slow
def test_verl_actor_update_sees_a_known_shift_of_behaviour_log_probs(killed_exgrpo_run):
    """veRL's real actor update (FSDP2 on gloo) computes the importance ratio of replayed tokens
    against the *stored* behaviour log-probs: lower every stored log-prob by DELTA, resume, and the
    ratio that comes out of the worker's loss is exp(DELTA) (times the policy's own small drift);
    the KL term of ``algorithm.kl_coeff`` (toward the behaviour policy) sees the same shift."""
    row = killed_exgrpo_run["shifted_step"]
    assert row["replay/questions"] > 0 and row["actor/off_token_fraction"] > 0, row
    expected = math.exp(DELTA)
    assert expected / 1.3 < row["actor/off_ratio_mean"] < expected * 1.3, row["actor/off_ratio_mean"]
    assert row["actor/on_ratio_max"] < 1.5  # fresh rows are untouched
    # KL(pi || behaviour), k3 per token: exp(-DELTA) + DELTA - 1 on a shifted (replayed) token, ~0 on
    # a fresh one; the token mean over the batch is that times the replayed tokens' share
    k3 = math.exp(-DELTA) + DELTA - 1
    want = k3 * row["actor/off_token_fraction"]
    assert want / 1.5 < row["actor/kl_loss"] < want * 1.5, (row["actor/kl_loss"], want)
