"""Adaptive seeds (``exgrpo compare --adaptive``): AdaStop's sequential test over stages of seeds.

The decisions are replayed from the runs' finals by :func:`exgrpo.compare.adaptive.decide`, the
function the command calls after each stage; the simulations here go through it too."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from exgrpo.compare import RunOutcome
from exgrpo.compare.adaptive import StageIncomplete, decide, format_decisions, run_adaptive, compared_pairs
from exgrpo.config import CompareConfig, ConfigError, load_compare


def _cc(arms=("grpo", "exgrpo"), **adaptive) -> CompareConfig:
    return CompareConfig(base={"tier": "toy"}, arms={a: {} for a in arms}, baseline="grpo", seeds=[0],
                         adaptive=adaptive)


def _finals(rng, means: dict[str, float], seeds: int = 40, first: int = 0) -> dict[str, dict[int, float]]:
    return {a: {s: float(rng.normal(m, 1.0)) for s in range(first, first + seeds)} for a, m in means.items()}


def test_a_clear_difference_is_decided_at_the_first_stage_and_only_the_undecided_arms_go_on():
    cc = _cc(("grpo", "exgrpo", "same"))
    rng = np.random.default_rng(0)
    finals = _finals(rng, {"grpo": 0.0, "exgrpo": -4.0})
    finals["same"] = dict(finals["grpo"])  # identical finals: never a difference
    first = decide(cc, {a: {s: v for s, v in f.items() if s < 5} for a, f in finals.items()})
    assert [(p.arm, p.other, p.decision, p.stage, p.seeds) for p in first.pairs] == [
        ("exgrpo", "grpo", "smaller", 1, 5), ("same", "grpo", "undecided", None, 5)]
    assert not first.finished and first.next_arms == ["grpo", "same"] and first.next_seeds == [5, 6, 7, 8, 9]
    done = decide(cc, finals)
    assert done.finished and done.stages_done == 4 and not done.next_arms
    same = done.pairs[1]
    assert (same.decision, same.stage, same.seeds, same.mean_diff) == ("equal", 4, 20, 0.0)
    assert done.pairs[0].seeds == 5  # a decided arm runs no further seed
    assert [[p.decision for p in stage] for stage in done.history] == [["smaller", "undecided"]] * 3 + [["smaller", "equal"]]
    table = format_decisions(done, cc)
    assert "| exgrpo vs grpo | behind | 1 | 5 | -" in table and "| same vs grpo | no difference found | 4 | 20 | +0.0000 |" in table


def test_the_decisions_replay_the_same_from_the_same_runs_and_stages_start_at_first_seed():
    """A resume replays the test from whatever runs the comparison's directory holds: in another order,
    among seeds outside the stages' blocks (a fixed comparison's, or seeds past the last stage), and
    read back from ``outcomes.json``. The decisions must be those of the stage blocks alone."""
    import json
    import random

    from exgrpo.compare.adaptive import finals_of

    cc = _cc(first_seed=100, seeds_per_stage=3)
    rng = np.random.default_rng(1)
    finals = _finals(rng, {"grpo": 0.0, "exgrpo": 0.6}, seeds=12, first=100)  # the four stages' blocks
    alone = decide(cc, finals)
    outcomes = [RunOutcome(arm, seed, v) for arm, by_seed in finals.items() for seed, v in by_seed.items()]
    outside = _finals(np.random.default_rng(2), {"grpo": 5.0, "exgrpo": -5.0}, seeds=100)  # seeds 0-99
    outside.update({a: {**outside[a], **{s: 9.0 * (a == "exgrpo") for s in range(112, 130)}} for a in outside})
    outcomes += [RunOutcome(arm, seed, v) for arm, by_seed in outside.items() for seed, v in by_seed.items()]
    random.Random(3).shuffle(outcomes)
    written = json.dumps([o.__dict__ for o in outcomes], default=str)  # as the comparison writes outcomes.json
    replayed = decide(cc, finals_of(RunOutcome(**d) for d in json.loads(written)))
    assert replayed.to_dict() == alone.to_dict()
    assert alone.stages_done >= 1 and [p.seeds for p in alone.pairs] == [3 * alone.stages_done]
    assert decide(cc, {}).next_seeds == [100, 101, 102]
    assert decide(cc, {arm: {s: 0.0 for s in range(3)} for arm in ("grpo", "exgrpo")}).stages_done == 0  # seeds 0-2 are not stage 1


def test_all_pairs_are_tested_when_asked():
    cc = _cc(("grpo", "a", "b"), pairs="all")
    assert compared_pairs(cc) == [("grpo", "a"), ("grpo", "b"), ("a", "b")]
    assert compared_pairs(_cc(("grpo", "a", "b"))) == [("a", "grpo"), ("b", "grpo")]


def test_a_stage_with_a_failed_run_stops_the_test_and_keeps_what_finished():
    cc = _cc(seeds_per_stage=2)

    def run_stage(sub: CompareConfig) -> list[RunOutcome]:  # exgrpo seed 1 fails
        return [RunOutcome(arm, s, 0.5) for s in sub.seeds for arm in sub.arms if (arm, s) != ("exgrpo", 1)]

    with pytest.raises(StageIncomplete, match=r"stage 1 is incomplete \(exgrpo seed 1 did not finish\).*--resume") as e:
        run_adaptive(cc, run_stage)
    assert len(e.value.outcomes) == 3 and e.value.state.stages_done == 0


def test_run_adaptive_runs_stages_until_decided_and_reports_each_stage_once():
    cc = _cc(("grpo", "exgrpo"), seeds_per_stage=3, max_stages=3)
    asked, told = [], []

    def run_stage(sub: CompareConfig) -> list[RunOutcome]:
        asked.append((list(sub.arms), list(sub.seeds)))
        return [RunOutcome(arm, s, float(s % 2) + (arm == "exgrpo") * 0.01) for s in sub.seeds for arm in sub.arms]

    earlier = [RunOutcome(arm, s, float(s % 2)) for s in range(3) for arm in ("grpo", "exgrpo")]  # stage 1, resumed
    outcomes, state = run_adaptive(cc, run_stage, outcomes=earlier, on_stage=told.append)
    assert asked == [(["grpo", "exgrpo"], [3, 4, 5]), (["grpo", "exgrpo"], [6, 7, 8])]  # stage 1 is not trained again
    assert [s.stages_done for s in told] == [1, 2, 3] and state.finished and len(outcomes) == 18


def test_adaptive_settings_come_from_the_file_and_set_and_bad_ones_fail_in_one_line(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("base: {tier: toy}\narms: {grpo: {}, exgrpo: {algorithm.replay: buckets}}\n"
                 "adaptive: {seeds_per_stage: 4}\n")
    cc = load_compare(f, {"adaptive.alpha": 0.01, "train.max_steps": 3})
    assert (cc.adaptive.seeds_per_stage, cc.adaptive.alpha, cc.base["train"]["max_steps"]) == (4, 0.01, 3)
    with pytest.raises(ConfigError, match=r"adaptive\.alpha: Input should be less than 0\.5"):
        load_compare(f, {"adaptive.alpha": 0.7})
    with pytest.raises(ConfigError, match=r"adaptive\.pairs"):
        load_compare(f, {"adaptive.pairs": "some"})


def test_seeds_and_adaptive_together_are_refused_before_any_work(tmp_path, capsys):
    from exgrpo.cli import main

    code = main(["compare", "experiments/toy.yaml", "--adaptive", "--seeds", "3", "--no-prefect",
                 "--output-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "adaptive.first_seed" in err[0], err
    assert not any(tmp_path.iterdir())


def _simulate(rng, effect: float, sims: int, cc: CompareConfig) -> tuple[float, float]:
    """Share of comparisons in which any pair was decided larger or smaller, and mean stages run; every
    arm but the baseline ``effect`` standard deviations from it."""
    rejected, stages = 0, []
    n = cc.adaptive.seeds_per_stage * cc.adaptive.max_stages
    for _ in range(sims):
        finals = _finals(rng, {arm: 0.0 if arm == cc.baseline else effect for arm in cc.arms}, seeds=n)
        state = decide(cc, finals)
        rejected += any(p.decision in ("larger", "smaller") for p in state.pairs)
        stages.append(state.stages_done)
    return rejected / sims, float(np.mean(stages))


@pytest.mark.slow
def test_the_recommended_settings_hold_the_error_rate_and_find_a_clear_effect_early():
    cc = _cc(permutations=1000)  # the recommended 4 stages of 5 seeds, alpha 0.05; 1,000 permutations for time
    alpha, sims = cc.adaptive.alpha, 400
    rate, _ = _simulate(np.random.default_rng(0), 0.0, sims, cc)
    # at or under alpha up to the simulation's own error: a one-sided binomial test at 1% does not reject
    # "rate <= alpha" (AdaStop's own per-pair test given alpha itself rejects about 2 x alpha: 40 of 400)
    assert rate * sims <= stats.binom.ppf(0.99, sims, alpha), rate
    found, stages = _simulate(np.random.default_rng(1), 2.0, 100, cc)  # two standard deviations between seeds
    assert found >= 0.95 and stages <= 2.0, (found, stages)


@pytest.mark.extended
@pytest.mark.slow
def test_eight_pairs_against_one_baseline_hold_the_family_wise_error():
    """docs/seeds.md's eight-pair case: eight arms with no difference from the baseline, 2,000 simulated
    comparisons, any pair called ahead or behind counts as an error. AdaStop's per-pair permutations (the
    same split index for every pair, a baseline shared) called one in 7.0% of 1,300 such comparisons; the
    joint permutations hold alpha up to the simulation's error (a one-sided binomial bound at 1%: 6.2% of
    2,000). 1,000 permutations a stage (the default is 10,000) keep it to about a minute and a half."""
    cc = _cc(("grpo", *(f"arm{i}" for i in range(1, 9))), permutations=1000)
    alpha, sims = cc.adaptive.alpha, 2000
    rate, _ = _simulate(np.random.default_rng(8), 0.0, sims, cc)
    assert rate * sims <= stats.binom.ppf(0.99, sims, alpha), rate


def test_compare_adaptive_in_local_processes_prints_each_stage_and_the_decisions(tmp_path, capsys):
    """The same comparison the Prefect flow's test runs, through ``--no-prefect``: "easy" (one-digit
    sums) is decided ahead at stage 1 on 3 seeds; "same" (grpo's own config) is never different."""
    import yaml

    from exgrpo.cli import main

    cfg = tmp_path / "cmp.yaml"
    cfg.write_text(yaml.safe_dump({
        "base": {"name": "adaptive", "task": {"max_operand": 9}, "policy": {"hidden": 32, "layers": 2},
                 "algorithm": {"group_size": 4, "replay": "none"}, "train": {"batch_size": 16, "max_steps": 2}},
        "arms": {"grpo": {}, "same": {}, "easy": {"task.max_operand": 1}}, "baseline": "grpo", "seeds": [0],
        "adaptive": {"seeds_per_stage": 3, "max_stages": 2, "alpha": 0.3},
    }, sort_keys=False))
    code = main(["compare", str(cfg), "--no-prefect", "--adaptive", "--workers", "1", "--no-progress",
                 "--output-dir", str(tmp_path / "runs")])
    seen = capsys.readouterr()
    out = seen.out + seen.err  # the progress console writes the stage lines beside its bar
    assert code == 0
    assert "stage 1: same vs grpo undecided; easy vs grpo larger" in out
    assert "| easy vs grpo | ahead | 1 | 3 |" in out and "| same vs grpo | no difference found | 2 | 6 | +0.0000 |" in out
    assert sorted(p.parent.name for p in (tmp_path / "runs").glob("adaptive/adaptive-easy/seed*/checkpoints")) == \
        ["seed0", "seed1", "seed2"]

