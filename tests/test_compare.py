import os
import subprocess
import tempfile
import sys
import time

import pytest

from exgrpo.compare import RunOutcome, diff_at_equal_tokens, format_table, summarize
from exgrpo.stats import bootstrap_ci, mean_ci, paired_difference, steps_to_target


def test_mean_ci_exact():
    e = mean_ci([1.0, 2.0, 3.0])
    # t_{0.975, 2} = 4.302653; s = 1; half = 4.302653 / sqrt(3)
    assert e.mean == 2.0 and e.half_width == pytest.approx(4.302653 / 3**0.5, rel=1e-6)
    assert mean_ci([5.0]).half_width == 0.0
    b = bootstrap_ci([1.0, 2.0, 3.0, 4.0])
    assert b.low < 2.5 < b.high


def test_paired_difference_and_steps_to_target():
    d = paired_difference([0.5, 0.6, 0.7], [0.4, 0.5, 0.6])
    assert d.mean == pytest.approx(0.1) and d.half_width == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="seeds must match"):
        paired_difference([1.0], [1.0, 2.0])
    assert steps_to_target([1, 2, 3], [0.1, 0.5, 0.9], 0.5) == 2.0
    assert steps_to_target([1, 2], [0.1, 0.2], 0.5) is None


def test_the_table_explains_itself():
    from exgrpo.compare import ArmSummary, format_table
    from exgrpo.stats import Estimate

    rows = [ArmSummary("grpo", Estimate(0.40, 0.35, 0.45, 3), None, 60.0),
            ArmSummary("exgrpo", Estimate(0.36, 0.33, 0.39, 3), Estimate(-0.04, -0.11, 0.02, 3), None),
            ArmSummary("big", Estimate(0.50, 0.47, 0.53, 3), Estimate(0.10, 0.05, 0.15, 3), 40.0)]
    text = format_table(rows, "val/accuracy", "grpo", horizon=120)
    assert "| grpo | 3 |" in text and "| grpo | 60 | — | — |" in text  # the baseline reaches its own final too
    assert "| exgrpo | not reached within 120 steps | — | — |" in text and "| big | 40 |" in text
    assert "mean over 3 seeds ± a Student-t 95% CI" in text
    assert ("exgrpo is behind grpo by 0.0400 in final val/accuracy over 3 paired seeds; "
            "the 95% CI includes zero, so no difference can be claimed.") in text
    assert "big is ahead of grpo by 0.1000 in final val/accuracy over 3 paired seeds; the 95% CI excludes zero." in text
    one = [ArmSummary("grpo", Estimate(0.4, 0.4, 0.4, 1), None, None),
           ArmSummary("exgrpo", Estimate(0.3, 0.3, 0.3, 1), Estimate(-0.1, -0.1, -0.1, 1), None)]
    assert "over 1 paired seed; one seed gives no interval, so no difference can be claimed" in format_table(
        one, "val/accuracy", "grpo")  # a degenerate [x, x] interval never reads as "excludes zero"


def test_the_table_reports_each_arms_compute_and_train_accuracy():
    from exgrpo.compare import outcome_extras

    step = {"compute/rollout_tokens": 10.0, "compute/grad_tokens": 12.0, "compute/fresh_questions": 30.0,
            "time/step_seconds": 1.5}
    assert outcome_extras([{"step": 1, **step},
                           {"step": 1, "val/accuracy": 0.5, "train/accuracy": 0.6},
                           {"step": 2, **step, "compute/rollout_tokens": 20.0, "compute/grad_tokens": 22.0},
                           {"step": 2, "val/accuracy": 0.5, "train/accuracy": 0.8}]) == {
        "rollout_tokens": 30.0, "grad_tokens": 34.0, "fresh_questions": 60.0, "train_seconds": 3.0, "final_train": 0.8}
    assert outcome_extras([{"step": 1, "val/accuracy": 0.5}])["fresh_questions"] is None  # not logged: unknown
    replay_term = outcome_extras([{"step": 1, **step, "compute/replay_term_tokens": 40.0}])
    assert replay_term["grad_tokens"] == 52.0 and replay_term["rollout_tokens"] == 10.0
    outs = [RunOutcome("grpo", s, 0.5, [1], [0.5], rollout_tokens=2e6, grad_tokens=2e6, final_train=0.5,
                       fresh_questions=9600, train_seconds=300.0) for s in range(2)]
    outs += [RunOutcome("ex", s, 0.5, [1], [0.5], rollout_tokens=3e6, grad_tokens=3.2e6, final_train=0.7 + 0.1 * s,
                        fresh_questions=6000 + 1000 * s, train_seconds=360.0) for s in range(2)]
    text = format_table(summarize(outs, ["grpo", "ex"], "grpo"), "val/accuracy", "grpo")
    assert "| 2.00 / 2.00 | 9,600 | 5.0 |" in text and "| 3.00 / 3.20 | 6,500 | 6.0 |" in text
    assert "tokens sampled / in loss" in text and "| fresh questions | train min |" in text
    assert "| 0.5000 ± 0.0000 | 0.7500 |" in text and "train acc.: greedy accuracy" in text


def test_when_an_arm_reaches_the_baseline_counts_the_seeds_that_never_do():
    from exgrpo.compare import median_reach

    # six of ten seeds reach the target, at these steps; the other four never do (beyond the horizon)
    reach = [25, 25, 50, 75, 100, 125, None, None, None, None]
    assert median_reach(reach) == 112.5  # the median of the six that reached alone would say 75
    assert median_reach([25, 50, None, None]) is None  # half never reach it: the median is beyond the horizon
    assert median_reach([25, None, 50]) == 50 and median_reach([]) is None


def test_the_table_reads_each_arm_at_the_tokens_and_time_it_spent():
    from exgrpo.compare import eval_compute

    rows = [{"step": 0, "val/accuracy": 0.1}]
    rows += [{"step": s, "compute/rollout_tokens": 100.0, "time/step_seconds": 6.0} for s in (1, 2)]
    rows[-1]["val/accuracy"] = 0.5
    assert eval_compute(rows, "val/accuracy") == {"curve_tokens": [0.0, 200.0], "curve_seconds": [0.0, 12.0]}
    assert eval_compute([{"step": 1, "val/accuracy": 0.5}], "val/accuracy") == {}  # not logged: unknown

    # grpo reaches its mean final 0.5 at step 2 after 2M tokens; "extra" samples 1.5x a step but
    # gets there at step 1: 1.5M tokens, 90 s
    outs = [RunOutcome("grpo", s, 0.5, [0, 1, 2], [0.1, 0.3, 0.5], curve_tokens=[0, 1e6, 2e6],
                       curve_seconds=[0, 60, 120]) for s in range(3)]
    outs += [RunOutcome("extra", s, 0.55, [0, 1, 2], [0.1, 0.5, 0.55], curve_tokens=[0, 1.5e6, 3e6],
                        curve_seconds=[0, 90, 180]) for s in range(3)]
    rows = {r.arm: r for r in summarize(outs, ["grpo", "extra"], "grpo")}
    assert (rows["grpo"].steps_to_baseline_final, rows["grpo"].tokens_to_baseline_final) == (2, 2e6)
    assert (rows["extra"].steps_to_baseline_final, rows["extra"].tokens_to_baseline_final,
            rows["extra"].seconds_to_baseline_final) == (1, 1.5e6, 90)
    text = format_table(list(rows.values()), "val/accuracy", "grpo")
    assert "| grpo | 2 | 2.00 | 2.0 |" in text and "| extra | 1 | 1.50 | 1.5 |" in text


def test_summarize_pairs_by_seed():
    outs = [RunOutcome("grpo", s, 0.25 * s, [1, 2], [0.0, 0.25 * s]) for s in range(3)]
    outs += [RunOutcome("ex", s, 0.25 * s + 0.125, [1, 2], [0.25 * s, 0.25 * s + 0.125]) for s in range(3)]
    rows = {r.arm: r for r in summarize(outs, ["grpo", "ex"], "grpo")}
    assert rows["ex"].diff_vs_baseline.mean == pytest.approx(0.125)
    assert rows["grpo"].diff_vs_baseline is None
    assert rows["ex"].steps_to_baseline_final == 1  # grpo's mean final 0.25 is reached at step 1 by seed 1, 2


TINY_COMPARE = (
    "base:\n  name: tiny\n  task: {max_operand: 5}\n  policy: {hidden: 16, layers: 2}\n"
    "  algorithm: {group_size: 4, replay_start_pass_rate: 0.0}\n  train: {batch_size: 16, epochs: 3, lr: 0.01}\n"
    "arms:\n  grpo: {algorithm.replay: none}\n  exgrpo: {algorithm.replay: buckets}\n"
    "baseline: grpo\nseeds: [0, 1, 2]\n"
)


def _check_outputs(out, tmp_path):
    assert out.returncode == 0, out.stderr[-3000:]
    assert "| grpo | 2 |" in out.stdout and "| exgrpo | 2 |" in out.stdout
    assert (out.stdout + out.stderr).count("| arm | seeds |") == 1  # the table is printed once
    assert "| grpo | 2 |" in out.stdout and "| step reaching grpo's final |" in out.stdout and "over 2 paired seeds" in out.stdout
    assert (tmp_path / "runs" / "tiny" / "comparison.png").stat().st_size > 10_000
    for arm in ("grpo", "exgrpo"):
        for seed in (0, 1):
            assert (tmp_path / "runs" / "tiny" / f"tiny-{arm}" / f"seed{seed}" / "metrics.jsonl").exists()


def test_compare_cli_local_processes(tmp_path):
    cfg = tmp_path / "cmp.yaml"
    cfg.write_text(TINY_COMPARE)
    out = subprocess.run(
        [sys.executable, "-m", "exgrpo.cli", "compare", str(cfg), "--seeds", "2", "--workers", "2",
         "--output-dir", str(tmp_path / "runs"), "--no-progress", "--no-prefect"],
        capture_output=True, text=True,
    )
    _check_outputs(out, tmp_path)


def test_compare_cli_resume_trains_only_the_new_seeds(tmp_path):
    """--resume on local processes: the seeds already run are reused as they are (their checkpoints
    untouched), a new seed trains, and the table covers all of them."""
    cfg = tmp_path / "cmp.yaml"
    cfg.write_text(TINY_COMPARE)
    base = [sys.executable, "-m", "exgrpo.cli", "compare", str(cfg), "--workers", "1",
            "--output-dir", str(tmp_path / "runs"), "--no-progress", "--no-prefect"]
    first = subprocess.run([*base, "--seeds", "1"], capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-3000:]
    ckpts = sorted((tmp_path / "runs").glob("tiny/tiny-*/seed0/checkpoints/*.pt"))
    stamps = {p: p.stat().st_mtime_ns for p in ckpts}
    assert len(stamps) == 2
    out = subprocess.run([*base, "--seeds", "2", "--resume"], capture_output=True, text=True)
    _check_outputs(out, tmp_path)
    assert {p: p.stat().st_mtime_ns for p in ckpts} == stamps
    finals = lambda text: [line for line in text.splitlines() if "seed 0: final" in line]  # noqa: E731
    said = lambda p: finals(p.stdout + p.stderr)  # noqa: E731  (the progress lines go to stderr)
    assert len(said(first)) == 2 and said(out) == said(first)  # seed 0 reports what it ended with the first time
    assert not list((tmp_path / "runs").glob("**/seed0.old-*"))  # nothing moved aside


def test_a_comparison_and_a_single_run_of_the_same_name_never_move_each_other(tmp_path):
    """A comparison's runs live under its own directory (runs/<comparison>/<comparison>-<arm>/seed<k>):
    a single run named like an arm keeps its directory, and the comparison keeps its own."""
    cfg = tmp_path / "cmp.yaml"
    cfg.write_text(TINY_COMPARE)
    runs = tmp_path / "runs"
    single = subprocess.run([sys.executable, "-m", "exgrpo.cli", "train", "experiments/toy-exgrpo.yaml", "--no-progress",
                             "--no-tracking", "--output-dir", str(runs), "--set", "name=tiny-exgrpo", "--max-steps", "2",
                             "--set", "task.max_operand=4", "--set", "policy.hidden=16", "--set", "train.batch_size=8"],
                            capture_output=True, text=True)
    assert single.returncode == 0, single.stderr[-3000:]
    single_ckpt = next((runs / "tiny-exgrpo" / "seed0" / "checkpoints").glob("*.pt"))
    stamp = single_ckpt.stat().st_mtime_ns
    cmp = [sys.executable, "-m", "exgrpo.cli", "compare", str(cfg), "--seeds", "1", "--workers", "1",
           "--output-dir", str(runs), "--no-progress", "--no-prefect"]
    for _ in range(2):  # and a second comparison into the same directory moves only its own runs aside
        out = subprocess.run(cmp, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-3000:]
    assert single_ckpt.stat().st_mtime_ns == stamp and not list(runs.glob("tiny-exgrpo/seed0.old-*"))
    assert sorted(p.relative_to(runs).as_posix() for p in runs.glob("tiny/*/seed0")) == [
        "tiny/tiny-exgrpo/seed0", "tiny/tiny-grpo/seed0"]
    assert len(list(runs.glob("tiny/tiny-*/seed0.old-*"))) == 2
    assert (runs / "tiny" / "comparison.png").is_file()


def test_compare_cli_runs_the_prefect_flow_into_mlflow(tmp_path):
    """The default path: Prefect's local API, runs as Ray tasks, a parent + 4 children in MLflow."""
    import mlflow

    cfg = tmp_path / "cmp.yaml"
    cfg.write_text(TINY_COMPARE)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay under 107 bytes
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "RAY_TMPDIR": ray_tmp}
    env.pop("PREFECT_API_URL", None)
    out = subprocess.run(
        [sys.executable, "-m", "exgrpo.cli", "compare", str(cfg), "--seeds", "2", "--workers", "2",
         "--output-dir", str(tmp_path / "runs"), "--tracking-uri", uri],
        capture_output=True, text=True, env=env,
    )
    _check_outputs(out, tmp_path)
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("tiny")
    found = client.search_runs([exp.experiment_id])
    parents = [r for r in found if r.data.tags.get("kind") == "compare"]
    children = [r for r in found if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert len(parents) == 1 and len(children) == 4
    assert {r.data.tags["algo"] for r in children} == {"grpo", "exgrpo"}
    assert parents[0].info.run_id in out.stdout


def test_flows_are_found_by_import_from_any_directory_and_use_the_projects_prefect_home(tmp_path):
    """`exgrpo compare/sweep` import the installed flows package; they used to look for ./flows and
    silently ran without Prefect when it was not there (any other working directory). Prefect, which
    reads its settings when imported, then has the project's home (where `exgrpo ui` looks)."""
    (tmp_path / "pyproject.toml").write_text("")
    code = ("from exgrpo.cli import _load_flow; print(_load_flow('compare', 'compare_flow').name, "
            "_load_flow('sweep', 'sweep_flow').name); from prefect.settings import get_current_settings; "
            "print(get_current_settings().home)")
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_HOME", "PREFECT_API_URL")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["compare", "sweep", str(tmp_path / ".prefect")]


def test_a_missing_flow_is_a_one_line_error_not_a_silent_fallback(monkeypatch, capsys):
    from exgrpo import cli

    monkeypatch.setitem(sys.modules, "flows.compare", None)  # the import now fails
    assert cli.main(["compare", "experiments/toy.yaml", "--seeds", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "flows/compare.py:compare_flow cannot be loaded" in err[0] and "--no-prefect" in err[0]


def test_compare_cli_shows_live_progress_from_the_ray_workers(tmp_path):
    """Two Ray workers, output captured as a non-terminal stream: per-run progress lines (step/total,
    pass@1) arrive while the runs are still going, and the runs done are counted."""
    cfg = tmp_path / "cmp.yaml"
    cfg.write_text(TINY_COMPARE)
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "RAY_TMPDIR": ray_tmp,
           "EXGRPO_PROGRESS_SECONDS": "0",
           "PREFECT_LOGGING_LEVEL": "INFO"}  # in the flow, progress lines are INFO logs (a shell may set WARNING)
    env.pop("PREFECT_API_URL", None)
    out = subprocess.run(
        [sys.executable, "-m", "exgrpo.cli", "compare", str(cfg), "--seeds", "1", "--workers", "2",
         "--output-dir", str(tmp_path / "runs"), "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db",
         "--set", "train.max_steps=150", "--set", "train.epochs=60"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    lines = out.stdout.splitlines()
    assert out.returncode == 0, "\n".join(lines[-40:])
    progress = [i for i, ln in enumerate(lines) if "progress: " in ln and ": step " in ln]
    finished = [i for i, ln in enumerate(lines) if "progress: " in ln and " finished | runs done" in ln]
    assert len(finished) == 2 and "runs done 2/2" in lines[finished[-1]], "\n".join(lines[-80:])
    for arm in ("grpo", "exgrpo"):
        mine = [i for i in progress if f"progress: {arm} seed 0: step " in lines[i]]
        assert mine, f"no progress line for {arm}:\n" + "\n".join(lines[-60:])
    assert progress[0] < finished[-1], "progress must show while the runs are still going"
    assert any("/150" in lines[i] and "pass@1" in lines[i] for i in progress)


def test_compare_cli_in_a_terminal_shows_a_live_table_with_totals_from_epochs(tmp_path):
    """Under a pseudo-terminal the progress is one rich table redrawn in place (no plain lines),
    and a config without train.max_steps still shows step/total (the trainer's planned steps)."""
    import pty
    import re

    cfg = tmp_path / "cmp.yaml"
    cfg.write_text(TINY_COMPARE)
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "RAY_TMPDIR": ray_tmp, "COLUMNS": "150",
           "LINES": "40", "TERM": "xterm"}
    env.pop("PREFECT_API_URL", None)
    env.pop("EXGRPO_PROGRESS", None)
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "exgrpo.cli", "compare", str(cfg), "--seeds", "1", "--workers", "2",
         "--output-dir", str(tmp_path / "runs"), "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db",
         "--set", "train.epochs=40"],
        stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait() == 0
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace"))
    assert "runs done 2/2" in text and "batch pass@1" in text, text[-3000:]
    assert "progress: " not in text  # a terminal gets the table, not the log lines
    totals = {m.group(1): int(m.group(3)) for m in re.finditer(r"(grpo|exgrpo) seed 0\S*\s*│\s*(\d+)/(\d+)", text)}
    assert set(totals) == {"grpo", "exgrpo"} and totals["grpo"] == totals["exgrpo"] > 40, text[-3000:]


def test_completed_fraction_counts_finished_runs_and_steps_of_running_ones():
    from exgrpo.live_progress import completed_fraction

    states = {"grpo seed 0": {"step": 30, "total": 60}, "exgrpo seed 0": {"step": 60, "total": 60},
              "grpo seed 1": {"step": 5, "total": None}}
    assert completed_fraction(states, {"exgrpo seed 0": ""}, 4) == pytest.approx((1 + 0.5) / 4)
    assert completed_fraction({}, {}, 4) == 0.0 and completed_fraction(states, {k: "" for k in states}, 3) == 1.0


def test_local_compare_runs_no_more_workers_than_the_cores_hold(tmp_path, capsys):
    """2 workers of 2-thread runs on 2 cores would oversubscribe them: one worker runs, and says so."""
    from exgrpo.compare import CompareConfig, run_local

    cc = CompareConfig.model_validate({
        "base": {"name": "cap", "output_dir": str(tmp_path / "runs"), "task": {"max_operand": 5},
                 "policy": {"hidden": 16, "layers": 1}, "train": {"max_steps": 2, "batch_size": 8, "threads": 2}},
        "arms": {"grpo": {"algorithm.replay": "none"}}, "seeds": [0, 1]})
    cores = len(os.sched_getaffinity(0))
    outcomes = run_local(cc, workers=cores)
    assert sorted(o.seed for o in outcomes) == [0, 1]
    said = capsys.readouterr().out
    assert f"compare: {max(1, cores // 2)} worker(s) instead of {cores}" in said


def test_a_resumed_comparison_says_a_run_without_checkpoint_starts_again_not_to_use_resume(tmp_path, capsys):
    """A run killed before its first checkpoint leaves its directory (config, a few metrics) behind;
    ``--resume`` moves it aside and trains it afresh, saying it had no checkpoint, not "use --resume"."""
    from exgrpo.compare import CompareConfig, run_local

    cc = CompareConfig.model_validate({
        "base": {"name": "early", "output_dir": str(tmp_path / "runs"), "task": {"max_operand": 5},
                 "policy": {"hidden": 16, "layers": 1}, "train": {"max_steps": 2, "batch_size": 8}},
        "arms": {"grpo": {"algorithm.replay": "none"}}, "seeds": [0, 1]})
    killed = tmp_path / "runs" / "early" / "early-grpo" / "seed0"
    killed.mkdir(parents=True)
    (killed / "metrics.jsonl").write_text('{"step": 0}\n')
    outcomes = run_local(cc, workers=1, resume=True)
    assert sorted(o.seed for o in outcomes) == [0, 1]
    said = capsys.readouterr().out
    assert f"note: {killed} held an earlier run; moved it to " in said
    assert "(it had no checkpoint to resume from)" in said and "use --resume" not in said, said
    assert "seed1 does not exist" not in said  # a seed new to the comparison is simply trained


def test_a_comparison_runs_some_of_its_arms_and_seeds_as_named():
    from exgrpo.config import ConfigError, load_compare, seed_list

    assert seed_list(3) == seed_list("3") == [0, 1, 2]
    assert seed_list("100-102") == [100, 101, 102] and seed_list("5,7") == [5, 7] and seed_list([4]) == [4]
    for bad in ("1-x", "3,3", "0"):
        with pytest.raises(ConfigError, match="--seeds"):
            seed_list(bad)
    cc = load_compare("experiments/tiny-lm-chain.yaml")
    some = cc.select("grpo,exgrpo", "100-101")
    assert list(some.arms) == ["grpo", "exgrpo"] and some.seeds == [100, 101]
    assert cc.select(None, None) == cc
    with pytest.raises(ConfigError, match="no arm foo here; the arms are grpo, exgrpo, exgrpo-extra, notebook"):
        cc.select("grpo,foo")
    with pytest.raises(ConfigError, match="paired against the baseline grpo; add it to --arms"):
        cc.select("exgrpo")


def test_a_comparisons_parent_keeps_what_the_arms_share():
    from exgrpo.compare import split_params

    common, differ = split_params({"grpo": {"lr": "1", "replay": "none"},
                                   "exgrpo": {"lr": "1", "replay": "buckets", "ratio": "0.5"}})
    assert common == {"lr": "1"} and differ == ["ratio", "replay"]  # a field one arm lacks differs too
    assert split_params({}) == ({}, [])


def test_a_failed_run_does_not_sink_the_others(tmp_path):
    """One run fails: the others still train and reach the statistics; the failure is reported as it
    happens (on_failed), or, without a listener, raised once every run has ended."""
    from exgrpo.compare import CompareConfig, RunsFailed, run_local, run_one

    cc = CompareConfig.model_validate({
        "base": {"name": "sink", "output_dir": str(tmp_path / "runs"), "task": {"max_operand": 5},
                 "policy": {"hidden": 16, "layers": 1}, "train": {"max_steps": 2, "batch_size": 8}},
        "arms": {"grpo": {"algorithm.replay": "none"}, "exgrpo": {"algorithm.replay": "buckets"}}, "seeds": [0, 1]})

    def runner(cfg, arm, metric, resume=False):
        if (arm, cfg.seed) == ("grpo", 0):
            raise RuntimeError("out of memory\nin step 2")
        return run_one(cfg, arm, metric, resume=resume)

    heard = []
    outcomes = run_local(cc, workers=1, runner=runner, on_failed=lambda *a: heard.append(a))
    assert sorted((o.arm, o.seed) for o in outcomes) == [("exgrpo", 0), ("exgrpo", 1), ("grpo", 1)]
    assert heard == [("grpo", 0, "RuntimeError: out of memory; in step 2")]  # every line of it, on one
    with pytest.raises(RunsFailed, match=r"1 run\(s\) failed: grpo seed 0: RuntimeError: out of memory; in step 2") as e:
        run_local(cc, workers=1, runner=runner)
    assert len(e.value.outcomes) == 3


def _sigterm_compare(tmp_path, env: dict, args: list[str], when: str) -> list:
    """Start `exgrpo compare` with ``args``, SIGTERM it once a line holds ``when``: exit 143 and
    "terminated", and every process it had started by then (its Prefect server, a private Ray's) ends."""
    import signal

    import psutil

    env = {**env, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_LOGGING_LEVEL": "INFO"}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "exgrpo.cli", "compare", "experiments/tiny-lm.yaml", "--no-progress",
         "--output-dir", str(tmp_path / "runs"), "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if when in line:
                break
        started = psutil.Process(proc.pid).children(recursive=True)
        assert started, "".join(seen[-20:])  # the Prefect server, at least
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=120)  # a hang guard
    finally:
        proc.kill()
        proc.wait()
    out = "".join(seen) + rest
    assert proc.returncode == 143, out[-3000:]
    assert "terminated\n" in out and "Traceback" not in out, out[-3000:]  # (Prefect logs its server's stop after it)
    _, alive = psutil.wait_procs(started, timeout=30)
    assert not alive, [" ".join(p.cmdline()) for p in alive]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    # the comparison and each run that had begun end KILLED, none left RUNNING for `exgrpo sync` to find
    assert {r.info.status for r in runs} <= {"KILLED"}, [(r.info.run_name, r.info.status) for r in runs]
    return runs


def test_sigterm_stops_what_a_comparison_started_and_ends_it_in_one_line(tmp_path):
    """SIGTERM to `exgrpo compare` while it trains its warm start, before any Ray is up."""
    env = {**os.environ, "EXGRPO_CACHE": str(tmp_path / "cache")}  # a warm start of its own, so that it must be trained
    _sigterm_compare(tmp_path, env, ["--seeds", "1", "--set", "policy.model.sft_steps=20000"],  # still training then
                     "warm start: not in the cache, training it now")


def test_sigterm_while_ray_trains_a_comparisons_runs_stops_them_and_the_ray_too(tmp_path):
    """SIGTERM once the runs train on the comparison's private Ray, whose ``ray.init`` installs a handler of
    its own (``sys.exit``): that crashed the flow, aborted the command (exit 134) and left its Prefect server
    and Ray's agents running."""
    runs = _sigterm_compare(tmp_path, dict(os.environ), ["--seeds", "2", "--workers", "2", "--set",
                                                        "train.max_steps=400"], "progress: ")
    assert len(runs) >= 2  # the comparison's and a run's, at least


def test_accuracy_at_equal_sampled_tokens_is_interpolated_on_the_evaluation_grid():
    from exgrpo.stats import value_at

    # a hand-made curve: accuracy 0.1 at 0 tokens, 0.3 at 1M, 0.5 at 2M (evaluations at steps 0, 1, 2)
    tokens, acc = [0.0, 1e6, 2e6], [0.1, 0.3, 0.5]
    assert value_at(1.5e6, tokens, acc) == pytest.approx(0.4)  # half way between 0.3 and 0.5
    assert value_at(0.25e6, tokens, acc) == pytest.approx(0.15)
    assert value_at(1e6, tokens, acc) == pytest.approx(0.3) and value_at(2e6, tokens, acc) == pytest.approx(0.5)
    assert value_at(2.5e6, tokens, acc) is None  # beyond the run's last evaluation: never extrapolated
    assert value_at(1e6, [], []) is None

    # grpo spends 2M tokens in its run, "extra" 3M: both are read at 2M, the budget every run reached;
    # extra's curve passes 0.5 at 1.5M and 0.55 at 3M, so at 2M it reads 0.5 + 0.05 / 3
    outs = [RunOutcome("grpo", s, 0.5, [0, 1, 2], [0.1, 0.3, 0.5], curve_tokens=[0, 1e6, 2e6]) for s in range(3)]
    outs += [RunOutcome("extra", s, 0.55 + 0.01 * s, [0, 1, 2], [0.1, 0.5, 0.55 + 0.01 * s],
                        curve_tokens=[0, 1.5e6, 3e6]) for s in range(3)]
    rows = {r.arm: r for r in summarize(outs, ["grpo", "extra"], "grpo")}
    assert rows["extra"].equal_tokens == 2e6 and rows["grpo"].equal_tokens is None
    d = rows["extra"].diff_at_equal_tokens
    # per seed: 0.5 + (0.05 + 0.01 s) / 3 - 0.5
    assert d.n == 3 and d.mean == pytest.approx((0.05 + 0.01) / 3) and d.low < d.mean < d.high
    text = format_table(list(rows.values()), "val/accuracy", "grpo")
    assert f"| +{d.mean:.4f} [{d.low:+.4f}, {d.high:+.4f}] at 2.00 M |" in text
    assert "diff vs grpo at equal tokens" in text
    one = {r.arm: r for r in summarize([o for o in outs if o.seed == 0], ["grpo", "extra"], "grpo")}
    assert "(one seed, no interval) at 2.00 M" in format_table(list(one.values()), "val/accuracy", "grpo")
    # each seed's pair is read at its own budget: seed 0's runs spent 1M and 1.5M, seed 1's 4M and 6M; read
    # at the fewest tokens of all runs (1M), seed 1 would be cut to a quarter of its pair's run
    uneven = [RunOutcome("grpo", 0, 0.3, [0, 1, 2], [0.1, 0.2, 0.3], curve_tokens=[0, 0.5e6, 1e6]),
              RunOutcome("extra", 0, 0.3, [0, 1, 2], [0.1, 0.2, 0.3], curve_tokens=[0, 0.75e6, 1.5e6]),
              RunOutcome("grpo", 1, 0.3, [0, 1, 2], [0.1, 0.2, 0.3], curve_tokens=[0, 2e6, 4e6]),
              RunOutcome("extra", 1, 0.7, [0, 1, 2], [0.1, 0.5, 0.7], curve_tokens=[0, 3e6, 6e6])]
    budget, d = diff_at_equal_tokens({o.seed: o for o in uneven if o.arm == "extra"},
                                     {o.seed: o for o in uneven if o.arm == "grpo"})
    # seed 0 at 1M: extra 0.2 + 0.1 * (0.25 / 0.75), grpo 0.3
    # seed 1 at 4M: extra 0.5 + 0.2 / 3 = 0.5667; grpo 0.3
    assert budget == pytest.approx(2.5e6)  # the median of 1M and 4M
    assert d.n == 2 and d.mean == pytest.approx(((0.2 + 0.1 / 3 - 0.3) + (0.5 + 0.2 / 3 - 0.3)) / 2)
    # a run without a token curve (a backend that does not log it) gives no reading, not a wrong one
    bare = [RunOutcome(a, s, 0.5, [0, 1], [0.1, 0.5]) for a in ("grpo", "extra") for s in range(2)]
    assert {r.arm: r for r in summarize(bare, ["grpo", "extra"], "grpo")}["extra"].diff_at_equal_tokens is None


def test_holm_holds_the_family_wise_error_over_a_pages_rows():
    from exgrpo.stats import Estimate, holm, t_test_p_value

    # Holm by hand: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 -> 0.02, 0.03, 0.06, 0.04 -> monotone 0.06
    adjusted, reject = holm([0.01, 0.04, 0.03, 0.005], alpha=0.05)
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02]) and reject == [True, False, False, True]
    assert holm([0.9], alpha=0.05) == ([0.9], [False]) and holm([0.5, 0.5, 0.5], 0.05)[0] == [1.0, 1.0, 1.0]
    # a paired t interval read back as its p-value: the two-sided test whose 95% interval ends at zero has p = 0.05
    d = paired_difference([0.3, 0.5, 0.4, 0.6], [0.2, 0.2, 0.3, 0.3])
    assert t_test_p_value(Estimate(d.mean, d.mean - d.half_width, d.mean + d.half_width, 4)) == pytest.approx(
        0.0405, abs=1e-4)  # scipy.stats.ttest_rel([.3, .5, .4, .6], [.2, .2, .3, .3]).pvalue
    assert t_test_p_value(Estimate(0.1, 0.0, 0.2, 10)) == pytest.approx(0.05)
    assert t_test_p_value(Estimate(0.0, -0.1, 0.1, 10)) == pytest.approx(1.0)


def _sleep_long(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_stopping_a_local_pool_ends_the_worker_that_is_running_a_run():
    """What a comparison on local processes does on Ctrl-C or SIGTERM: the worker busy with a run is ended
    when the stop returns (the pool's shutdown forgets its workers, so they must be read before it)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing.connection import wait

    from exgrpo.compare import _stop_pool

    ex = ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn"))
    future = ex.submit(_sleep_long, 600)
    deadline = time.monotonic() + 60
    while not future.running() and time.monotonic() < deadline:
        time.sleep(0.1)
    (worker,) = list(ex._processes.values())
    try:
        _stop_pool(ex)
        # its sentinel, not is_alive(): the pool's thread may have reaped it, and is_alive() of a process
        # another thread reaped reads "alive"
        assert wait([worker.sentinel], 0) == [worker.sentinel]
    finally:
        worker.kill()
