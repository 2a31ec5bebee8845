"""End to end through the real trainer path (and the real CLI), on a tiny toy problem."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from exgrpo.backends.native import checkpoint as ckpt
from exgrpo.backends.native.trainer import Trainer
from exgrpo.config import load_experiment

SMALL = {
    "task.max_operand": 6, "policy.hidden": 32, "policy.layers": 2, "algorithm.group_size": 4,
    "train.batch_size": 16, "train.epochs": 8, "train.lr": 1e-2, "algorithm.replay_start_pass_rate": 0.0,
    "train.mini_batches": 2,
}


def small_cfg(tmp_path, **extra):
    sets = {**SMALL, "output_dir": str(tmp_path), **extra}
    if sets.get("algorithm.replay") in ("none", "notebook"):  # a setting of the pool algorithms only
        sets.pop("algorithm.replay_start_pass_rate")
    return load_experiment("experiments/toy-exgrpo.yaml", sets)


def strip_time(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


@pytest.mark.parametrize("replay", ["none", "buckets", "notebook", "uniform"])
def test_every_algorithm_trains_end_to_end(tmp_path, replay):
    nb = {"algorithm.notebook.warm": 1, "algorithm.notebook.peak": 2} if replay == "notebook" else {}
    cfg = small_cfg(tmp_path, **{"algorithm.replay": replay, **nb})
    trainer = Trainer(cfg)
    stored: list[float] = []  # per step: tokens of the replay term's stored responses (0 without one)
    auxiliary = trainer.replay.auxiliary

    def recording_auxiliary(epoch, step):
        aux = auxiliary(epoch, step)
        stored.append(0.0 if aux is None else float(aux.mask.sum()))
        return aux

    trainer.replay.auxiliary = recording_auxiliary
    assert trainer.steps_per_epoch == 5  # 78 train questions / 16 per step
    result = trainer.fit(progress=False)
    hist = result.history
    assert len(hist) == result.final_metrics["step"] == 8 * 5
    assert "val/accuracy" in hist[-1]
    if replay in ("buckets", "uniform"):
        replayed = [h["replay/questions"] for h in hist]
        assert max(replayed) > 0, "replay never happened"
        assert any(h["actor/off_token_fraction"] > 0 for h in hist)
        assert max(h["pool/questions"] for h in hist) > 0
    if replay == "notebook":
        assert any(h["notebook/lambda"] > 0 and h.get("notebook/off_w_mean", 0) > 0 for h in hist)
        # the replay term's stored responses count as tokens in the loss once per mini-batch
        assert len(stored) == len(hist) and any(stored)
        counted = [h.get("compute/replay_term_tokens", 0.0) for h in hist]
        assert counted == [s * cfg.train.mini_batches for s in stored]
    if replay == "none":
        assert all(h["replay/questions"] == 0 for h in hist)
    if replay not in ("buckets", "uniform"):  # only pool replay has a mixed phase (and drops clipping in it)
        assert all(h["replay/started"] == 0 for h in hist)


def test_resume_equals_uninterrupted_bit_for_bit(tmp_path):
    full = Trainer(small_cfg(tmp_path / "a", **{"train.checkpoint_every": 5})).fit(progress=False)

    cfg = small_cfg(tmp_path / "b", **{"train.checkpoint_every": 5})
    Trainer(cfg).fit(progress=False, stop_after_step=12)  # "killed" after step 12, last checkpoint at 10
    state = ckpt.load_state(ckpt.latest_checkpoint(cfg.run_dir()))
    assert state["step"] == 12 or state["step"] == 10
    assert len(state["replay"]["pool"]["qid"]) > 0, "the experience pool must be in the checkpoint"
    resumed = Trainer(cfg).fit(progress=False, resume=True)

    assert strip_time(resumed.history) == strip_time(full.history)
    lines = [json.loads(x) for x in (cfg.run_dir() / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(1, 41))
    a, b = Trainer(small_cfg(tmp_path / "a")), Trainer(cfg)
    ckpt.load(a, ckpt.latest_checkpoint(tmp_path / "a" / cfg.name / "seed0"))
    ckpt.load(b, ckpt.latest_checkpoint(cfg.run_dir()))
    for (n, p), (_, q) in zip(a.policy.state_dict().items(), b.policy.state_dict().items(), strict=True):
        assert torch.equal(p, q), n
    sa, sb = a.replay.pool.state_dict(), b.replay.pool.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa if k != "format")


@pytest.mark.slow
def test_cli_train_killed_then_resumed_matches_uninterrupted(tmp_path):
    """A real SIGKILL of `exgrpo train` mid-run, then `--resume`."""
    sets = [f"--set={k}={v}" for k, v in {**SMALL, "train.epochs": 60, "train.checkpoint_every": 10}.items()]
    base = [sys.executable, "-m", "exgrpo.cli", "train", "experiments/toy-exgrpo.yaml", "--no-progress", *sets]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    ref = subprocess.run([*base, "--output-dir", str(tmp_path / "ref")], capture_output=True, text=True, env=env)
    assert ref.returncode == 0, ref.stderr

    out = tmp_path / "killed"
    proc = subprocess.Popen([*base, "--output-dir", str(out)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckdir = out / "toy-exgrpo" / "seed0" / "checkpoints"
    deadline = time.time() + 120
    while time.time() < deadline and not list(ckdir.glob("step_*.pt")):
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    kept = sorted(ckdir.glob("step_*.pt"))
    assert kept, "no checkpoint before the kill"
    res = subprocess.run([*base, "--output-dir", str(out), "--resume"], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr

    def rows(root):
        text = (root / "toy-exgrpo" / "seed0" / "metrics.jsonl").read_text()
        return strip_time([json.loads(x) for x in text.splitlines()])

    assert rows(out) == rows(tmp_path / "ref")


def test_resume_without_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        Trainer(small_cfg(tmp_path)).fit(progress=False, resume=True)


def test_a_finished_runs_last_checkpoint_can_leave_out_the_optimiser_and_still_reads_back(tmp_path, capsys):
    sets = {"train.checkpoint_every": 5, "train.max_steps": 10, "train.final_checkpoint_optimizer": False}
    cfg = small_cfg(tmp_path, **sets)
    full = Trainer(cfg).fit(progress=False)
    kept = ckpt.checkpoints(cfg.run_dir())
    assert [p.name for p in kept] == ["step_0000005.pt", "step_0000010.pt"]
    assert "optimizer" in ckpt.load_state(kept[0]) and "optimizer" not in ckpt.load_state(kept[1])
    assert kept[1].stat().st_size < kept[0].stat().st_size
    again = Trainer(cfg).fit(progress=False, resume=True)  # a finished run reads back at once, its record whole
    assert again.final_metrics == full.final_metrics and len(again.history) == len(full.history)
    longer = small_cfg(tmp_path, **{**sets, "train.max_steps": 20})
    with pytest.raises(ckpt.CheckpointError, match="final_checkpoint_optimizer=false.*cannot train past step 10"):
        Trainer(longer).fit(progress=False, resume=True)
    from exgrpo.cli import main  # as a user meets it: one line, no traceback

    capsys.readouterr()
    sets = [f"--set={k}={v}" for k, v in {**SMALL, **sets}.items()]
    assert main(["train", "experiments/toy-exgrpo.yaml", *sets, "--max-steps", "20", "--resume", "--no-tracking",
                 "--no-progress", "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: --resume: ") and "cannot train past step 10" in err[0], err
    with pytest.raises(Exception, match="train.final_checkpoint_optimizer=false has no veRL backend"):
        load_experiment("experiments/verl-tiny-exgrpo.yaml", {"train.final_checkpoint_optimizer": False})


# ------------------------------------------------------------------ torn files
def test_torn_newest_checkpoint_falls_back_to_the_newest_intact_one(tmp_path, capsys):
    """Before: a truncated newest checkpoint crashed --resume. Now resume says which file is torn,
    continues from the one before, and ends where the uninterrupted run ends."""
    full = Trainer(small_cfg(tmp_path / "a", **{"train.checkpoint_every": 5})).fit(progress=False)
    cfg = small_cfg(tmp_path / "b", **{"train.checkpoint_every": 5})
    Trainer(cfg).fit(progress=False, stop_after_step=15)
    newest = ckpt.latest_checkpoint(cfg.run_dir())
    assert newest.name == "step_0000015.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 3])  # torn mid-write
    with (cfg.run_dir() / "metrics.jsonl").open("a") as f:
        f.write('{"step": 16.0, "actor/lo')  # a kill during a metrics write
    resumed = Trainer(cfg).fit(progress=False, resume=True)
    err = capsys.readouterr().err
    assert "step_0000015.pt is unreadable" in err and "falling back to the previous one (step_0000010.pt)" in err
    assert "torn metrics line is dropped" in err
    assert strip_time(resumed.history) == strip_time(full.history)


def test_only_torn_checkpoints_is_a_clear_error(tmp_path):
    cfg = small_cfg(tmp_path, **{"train.checkpoint_every": 5})
    Trainer(cfg).fit(progress=False, stop_after_step=5)
    only = ckpt.latest_checkpoint(cfg.run_dir())
    only.write_bytes(b"not a checkpoint")
    with pytest.raises(FileNotFoundError, match="no readable checkpoint"):
        Trainer(cfg).fit(progress=False, resume=True)


def test_a_failed_atomic_write_leaves_the_old_file_and_no_tmp(tmp_path):
    from exgrpo.atomic import torch_save_atomic, write_text_atomic

    target = tmp_path / "state.pt"
    torch_save_atomic({"x": torch.ones(2)}, target)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("disk full")  # stands in for any failure during the write

    with pytest.raises(RuntimeError, match="disk full"):
        torch_save_atomic({"x": Unpicklable()}, target)
    assert [p.name for p in tmp_path.iterdir()] == ["state.pt"]
    assert torch.equal(torch.load(target, weights_only=True)["x"], torch.ones(2))
    write_text_atomic(tmp_path / "a.txt", "hello")
    assert (tmp_path / "a.txt").read_text() == "hello" and not (tmp_path / "a.txt.tmp").exists()


def test_keep_last_keeps_the_disk_bounded(tmp_path):
    cfg = small_cfg(tmp_path, **{"train.checkpoint_every": 2, "train.keep_last": 2, "train.max_steps": 11})
    Trainer(cfg).fit(progress=False)
    assert [p.name for p in ckpt.checkpoints(cfg.run_dir())] == ["step_0000010.pt", "step_0000011.pt"]
    assert Trainer(cfg).fit(progress=False, resume=True).final_metrics["step"] == 11


def test_a_run_stops_at_its_sampled_token_budget_and_resumes_to_it(tmp_path):
    cfg = small_cfg(tmp_path, **{"train.max_steps": 11, "train.checkpoint_every": 100, "train.max_sampled_tokens": 1})
    per_step = Trainer(cfg).train_step()["compute/rollout_tokens"]
    budget = int(2.5 * per_step)  # reached during step 3: the run stops after it, evaluated and checkpointed
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"max_sampled_tokens": budget})})
    result = Trainer(cfg).fit(progress=False)
    steps = [h for h in result.history if h["step"] > 0]
    assert [h["step"] for h in steps] == [1, 2, 3] and "val/accuracy" in steps[-1]
    assert sum(h["compute/rollout_tokens"] for h in steps) >= budget > sum(h["compute/rollout_tokens"] for h in steps[:2])
    assert [p.name for p in ckpt.checkpoints(cfg.run_dir())] == ["step_0000003.pt"]
    assert Trainer(cfg).fit(progress=False, resume=True).final_metrics["step"] == 3  # spent: nothing more to train
    with pytest.raises(Exception, match="train.max_sampled_tokens has no veRL backend"):
        load_experiment("experiments/verl-tiny-exgrpo.yaml", {"train.max_sampled_tokens": budget})


def test_budget_steps_beyond_the_epochs_are_said_not_silently_capped(tmp_path, capsys):
    trainer = Trainer(small_cfg(tmp_path, **{"train.epochs": 2, "train.max_steps": 50}))
    assert trainer.total_steps == 10
    err = capsys.readouterr().err
    assert "train.max_steps=50 is more than the 10 steps train.epochs=2 allow" in err


def test_replay_added_to_the_batch_keeps_grpos_fresh_budget(tmp_path):
    """algorithm.replay_adds_to_batch: B fresh questions every step and the replayed ones on top, so
    the compute metrics count (B + replayed) groups in the loss and one stored row less per replayed
    group sampled; the paper's default takes the replayed questions' slots from the batch."""
    from exgrpo.config import ConfigError, load_experiment

    b, k = 32, 16
    for adds in (False, True):
        cfg = load_experiment("experiments/toy-exgrpo.yaml", {
            "algorithm.replay_adds_to_batch": adds, "algorithm.replay_start_pass_rate": 0.0, "train.max_steps": 5,
            "train.batch_size": b, "output_dir": str(tmp_path), "name": f"adds-{adds}"})
        rows = [h for h in Trainer(cfg).fit(progress=False).history if "compute/grad_tokens" in h]
        assert max(h["replay/questions"] for h in rows) > 0
        for h in rows:  # toy responses are one token long
            groups = b + h["replay/questions"] if adds else b
            assert h["compute/grad_tokens"] == groups * k
            assert h["compute/rollout_tokens"] == groups * k - h["replay/questions"]
    with pytest.raises(ConfigError, match="replay_adds_to_batch=true has no veRL backend"):
        load_experiment("experiments/verl-tiny-exgrpo.yaml", {"algorithm.replay_adds_to_batch": True})


def test_keep_freed_memory_keeps_a_freed_large_tensor_in_the_process():
    """glibc hands a 200 MB tensor back to the system on free unless told otherwise (then every step
    page-faults its large tensors afresh); with the setting the pages stay for the next step."""
    import subprocess
    import sys

    probe = (
        "import os, torch\n"
        "from exgrpo.backends.native.memory import keep_freed_memory\n"
        "applied = keep_freed_memory() if os.environ['KEEP'] == '1' else None\n"
        "rss = lambda: int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')\n"
        "before = rss(); x = torch.ones(50_000_000); del x\n"
        "print(applied, (rss() - before) // 2**20)\n"
    )
    kept = {}
    for keep in ("0", "1"):
        out = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "KEEP": keep}, capture_output=True,
                             text=True, check=True).stdout.split()
        kept[keep] = (out[0], int(out[1]))
    assert kept["1"][0] == "True" and kept["1"][1] >= 150, kept  # the freed 191 MB stays resident
    assert kept["0"][1] < 50, kept  # default glibc: returned at once


@pytest.mark.parametrize("experiment,steps", [
    ("experiments/toy-exgrpo.yaml", 4),
    pytest.param("experiments/tiny-lm.yaml", 3, marks=pytest.mark.slow),  # the LM tier: 20 s
])
def test_two_threads_reproduce_a_run_bit_for_bit(tmp_path, experiment, steps):
    """Same seed, 2 torch threads, twice: the same metrics and parameters. (Gathering a shared
    prompt's key/value cache to its K rows with x[idx] made the tiny-lm case fail: on a CPU with more
    than one thread its backward adds the K gradients in a varying order.)"""
    from exgrpo.backends.native.trainer import train

    runs = []
    for i in range(2):
        cfg = load_experiment(experiment, {"train.max_steps": steps, "seed": 0, "train.threads": 2,
                                           "train.eval_before_train": False, "train.eval_every_steps": None,
                                           "output_dir": str(tmp_path / str(i))})  # what is compared is trained
        res = train(cfg, progress=False)
        runs.append(([{k: v for k, v in row.items() if not k.startswith("time/")} for row in res.history],
                     [p.detach().clone() for p in res.policy.parameters()]))
    (h0, p0), (h1, p1) = runs
    assert h0 == h1
    assert all(torch.equal(a, b) for a, b in zip(p0, p1, strict=True))


@pytest.mark.parametrize("layout", ["grouped", "shuffled", "replay_mixed", "one_row", "all_same", "empty"])
def test_unique_rows_equals_torch_unique_on_every_batch_layout(layout):
    """The toy policy's fast dedupe gives torch.unique(dim=0)'s exact rows and inverse, whether each
    prompt's K copies sit together (the trainer's layout), are scattered, or are mixed with replays."""
    from exgrpo.policies.mlp_policy import unique_rows

    g = torch.Generator().manual_seed(0)
    table = torch.randint(0, 3, (40, 4), generator=g).float() / 2  # few values: many equal columns
    table[5, 0] = -0.0  # -0.0 and 0.0 are equal rows to torch.unique
    qids = {"grouped": torch.randint(0, 40, (12,), generator=g).repeat_interleave(8),
            "shuffled": torch.randint(0, 40, (96,), generator=g),
            "one_row": torch.tensor([3]), "all_same": torch.full((16,), 7), "empty": torch.zeros(0, dtype=torch.long)}
    qids["replay_mixed"] = torch.cat([qids["grouped"][:40], torch.tensor([1, 5, 1]), qids["grouped"][40:]])
    x = table[qids[layout]]
    want_rows, want_inverse = torch.unique(x, dim=0, return_inverse=True)
    rows, inverse = unique_rows(x)
    assert torch.equal(rows, want_rows) and torch.equal(inverse, want_inverse)
    assert torch.equal(rows[inverse], x)


def test_the_replayed_rows_are_the_pools_stored_trajectories_at_the_configured_share(tmp_path, monkeypatch):
    """The plumbing bugs other replay trainers shipped: a buffer that kept one group only (TRL
    #6804), one stored row sampled many times (torchtune #2943). Every step that replays, in a real
    run: round(ratio * B) distinct pooled questions, each row a trajectory the pool holds for that
    question (its tokens, and its stored behaviour log-probs as pi_old), drawn from many steps' groups."""
    from exgrpo.backends.native import trainer as native

    cfg = small_cfg(tmp_path, **{"train.max_steps": 12, "algorithm.experience_ratio": 0.25})
    trainer = Trainer(cfg)
    seen: list[tuple[int, int, set[int]]] = []
    real = native.assemble_batch

    def checked(replays, fresh_qids, *args):
        batch = real(replays, fresh_qids, *args)
        k, pool = cfg.algorithm.group_size, trainer.replay.pool
        if len(replays):
            # the configured share, or every pooled question while the pool holds fewer
            share = min(round(0.25 * cfg.train.batch_size), int(pool.stats()["pool/questions"]))
            assert len(replays) == share and len(fresh_qids) == cfg.train.batch_size - share
            assert len(set(replays.qids)) == len(replays.qids)
            assert batch.off_policy.nonzero().flatten().tolist() == [g * k for g in range(len(replays))]
            for g, q in enumerate(replays.qids):
                row, n = batch.tokens[g * k], int(batch.mask[g * k].sum())
                stored = [pool.trajectory(r) for r in pool.rows(q)]
                match = [t for t in stored if list(t.tokens) == row[:n].tolist()
                         and torch.allclose(torch.tensor(t.behaviour_log_prob), batch.old_log_prob[g * k, :n])]
                assert match, f"replayed row of question {q} is none of its {len(stored)} stored trajectories"
            seen.append((trainer.step, len(replays), {t.step for q in replays.qids for r in pool.rows(q)
                                                       for t in [pool.trajectory(r)]}))
        return batch

    monkeypatch.setattr(native, "assemble_batch", checked)
    trainer.fit(progress=False)
    assert len(seen) >= 8  # replay runs from the second step on (start threshold 0)
    assert sum(n == round(0.25 * cfg.train.batch_size) for _, n, _ in seen) >= 6  # at the full share once the pool fills
    assert len(set().union(*(steps for *_, steps in seen))) >= 3  # collected at many steps, not one group's
