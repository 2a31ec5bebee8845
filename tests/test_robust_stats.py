"""IQM, probability of improvement and performance profiles (rliable's conventions, on scipy.stats)."""

import numpy as np
import pytest
from scipy.stats import mannwhitneyu

from exgrpo.stats import iqm, iqm_ci, performance_profile, probability_of_improvement


def test_iqm_is_the_mean_of_the_middle_half():
    assert iqm([1, 2, 3, 4, 5, 6, 7, 8]) == pytest.approx(4.5)
    assert iqm([0.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 100.0]) == pytest.approx(0.5)  # outliers do not move it


def test_iqm_ci_brackets_the_estimate_and_narrows_with_seeds():
    rng = np.random.default_rng(0)
    few, many = rng.normal(0.3, 0.05, 5), rng.normal(0.3, 0.05, 40)
    a, b = iqm_ci(few), iqm_ci(many)
    assert a.low <= a.mean <= a.high and b.low <= b.mean <= b.high
    assert b.high - b.low < a.high - a.low
    assert iqm_ci(few) == iqm_ci(few)  # seeded
    assert iqm_ci([0.2, 0.2, 0.2]).half_width == 0.0


def test_probability_of_improvement_is_the_normalised_mann_whitney_u():
    x, y = [0.1, 0.2, 0.3, 0.4, 0.4], [0.1, 0.25, 0.35, 0.2]
    p = probability_of_improvement(x, y)
    assert p.mean == pytest.approx(mannwhitneyu(x, y).statistic / (len(x) * len(y)))
    assert p.low <= p.mean <= p.high
    assert probability_of_improvement([0.5, 0.6, 0.7], [0.1, 0.2, 0.3]).mean == 1.0
    assert probability_of_improvement([0.3, 0.3], [0.3, 0.3]).mean == 0.5


def test_performance_profile_is_the_fraction_of_runs_above_each_threshold():
    assert performance_profile([0.1, 0.2, 0.3, 0.4], [0.0, 0.15, 0.35, 0.5]).tolist() == [1.0, 0.75, 0.25, 0.0]


def test_the_comparison_figure_reads_the_arms_at_steps_tokens_and_minutes(tmp_path):
    from PIL import Image

    from exgrpo.compare import RunOutcome
    from exgrpo.compare import mean_along
    from exgrpo.compare.figures import comparison_figure

    outcomes = [RunOutcome(arm, seed, final, [10.0, 20.0], [final / 2, final], curve_tokens=[1e6 * k, 2e6 * k + seed],
                           curve_seconds=[60.0, 120.0])
                for arm, finals, k in (("grpo", [0.3, 0.35, 0.4], 1.0), ("exgrpo", [0.32, 0.45, 0.5], 1.4))
                for seed, final in enumerate(finals)]
    assert mean_along(outcomes[3:], "curve_tokens") == pytest.approx([1.4e6, 2.8e6 + 1])  # mean over seeds, per evaluation
    assert mean_along([RunOutcome("grpo", 0, 0.3, [10.0], [0.3])], "curve_tokens") is None  # not logged: no curve
    out = comparison_figure(outcomes, ["grpo", "exgrpo"], "val/accuracy", tmp_path / "cmp.png")
    width, height = Image.open(out).size
    assert 1.5 * height < width < 2.5 * height  # two rows of three panels


def _write_run(path, rows):
    import json

    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_the_mechanism_series_are_means_over_seeds_of_what_the_trainer_logged(tmp_path):
    from PIL import Image

    from exgrpo.compare import RunOutcome
    from exgrpo.compare.figures import _mean_curve, _replayed_token_share, _read, mechanism_figure

    def step(s, replayed, seed):  # 32 questions a step; a replayed question's stored row is not re-sampled
        return {"step": s, "compute/rollout_tokens": 100.0 - replayed, "compute/grad_tokens": 100.0,
                "compute/fresh_questions": 32.0 - replayed, "actor/off_ratio_mean": 1.0 + 0.1 * seed,
                "pool/bucket_1": float(s), "pool/bucket_2": 2.0 * s}

    pool = [RunOutcome("exgrpo", seed, 0.5, [], [], run_dir=_write_run(tmp_path / f"ex{seed}", [
        step(1, 0, seed), step(2, 10, seed), step(3, 20 + 10 * seed, seed)])) for seed in range(2)]
    rows = [_read(o.run_dir) for o in pool]
    steps, share = _replayed_token_share(rows)
    assert list(steps) == [1, 2, 3] and share == pytest.approx([0.0, 0.1, 0.25])
    assert _mean_curve(rows, "compute/fresh_questions", cumulative=True)[1] == pytest.approx([32, 54, 61])
    assert _mean_curve(rows, "notebook/lambda") is None  # an arm without the notebook's term draws none
    rows[0][0]["actor/off_ratio_mean"] = 0.0  # nothing replayed at step 1 of seed 0: no ratio, not a ratio of 0
    assert list(_mean_curve(rows, "actor/off_ratio_mean", nonzero=True)[0]) == [2, 3]
    notebook = [_read(_write_run(tmp_path / "nb", [{**step(1, 0, 0), "compute/replay_term_tokens": 25.0}]))]
    assert _replayed_token_share(notebook)[1] == pytest.approx([0.2])  # its replay term's 25 of 125 loss tokens
    grpo = [RunOutcome("grpo", 0, 0.4, [], [], run_dir=_write_run(tmp_path / "grpo", [
        {"step": 1, "compute/rollout_tokens": 100.0, "compute/grad_tokens": 100.0, "compute/fresh_questions": 32.0}]))]
    out = mechanism_figure(pool + grpo, ["grpo", "exgrpo"], tmp_path / "why.png")
    width, height = Image.open(out).size
    assert width > 3 * height


def test_the_dashboard_reads_each_arm_at_the_tokens_it_sampled(tmp_path):
    """A comparison's dashboard, from the MLflow records alone: each child's sampled tokens summed up
    to its evaluations, the arms' token reading in the summary, and the learning curves drawn
    against tokens too."""
    import mlflow

    from exgrpo.dashboard.comparison import curves_figure, load_comparison, summary_table
    from exgrpo.tracking import Tracker

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = Tracker(uri)
    parent = tracker.start_run("cmp", "parent", {"kind": "compare", "metric": "val/accuracy", "baseline": "grpo",
                                                 "arms": "grpo,extra"})
    client = mlflow.MlflowClient(uri)
    for arm, per_step, acc in (("grpo", 100.0, [0.1, 0.3, 0.5]), ("extra", 150.0, [0.1, 0.5, 0.55])):
        for seed in (0, 1):
            run = tracker.start_run("cmp", f"{arm}-{seed}", {"arm": arm, "seed": str(seed)}, parent)
            for step, value in enumerate(acc):
                client.log_metric(run, "val/accuracy", value, step=step)
                if step:
                    client.log_metric(run, "compute/rollout_tokens", per_step * 1e4, step=step)
                    client.log_metric(run, "time/step_seconds", 1.0, step=step)
            client.log_metric(run, "final/val/accuracy", acc[-1], step=2)
            tracker.end_run(run, "FINISHED")
    tracker.end_run(parent, "FINISHED")
    data = load_comparison(client, uri, client.get_run(parent))
    assert {o.arm: o.curve_tokens for o in data.outcomes} == {"grpo": [0, 1e6, 2e6], "extra": [0, 1.5e6, 3e6]}
    rows = {r.arm: r for r in data.rows}
    assert (rows["grpo"].tokens_to_baseline_final, rows["extra"].tokens_to_baseline_final) == (2e6, 1.5e6)
    table = summary_table(data)
    assert 'data-col="tokens_to_target"' in table and ">1.50<" in table and ">2.00<" in table
    assert "against the response tokens each arm had sampled" in curves_figure(data)
