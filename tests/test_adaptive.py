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


@pytest.mark.parametrize("problems, solved, decisions", [
    (10, {"grpo": [8, 6, 8, 8, 5, 7, 8, 6, 8, 8], "exgrpo": [5, 6, 4, 5, 7, 8, 7, 6, 7, 5]}, [("equal", 2)]),
    (30, {"grpo": [20, 19, 19, 18, 20, 21, 16, 20, 15, 20], "a1": [19, 19, 17, 16, 21, 18, 17, 20, 18, 17],
          "a2": [12, 14, 17, 17, 21, 20, 13, 17, 14, 17]}, [("equal", 2), ("equal", 2)]),
], ids=["fractions-differed-from-percent", "a-tie-with-stage-1s-boundary"])
def test_the_same_finals_in_fractions_and_in_percent_get_the_decisions_of_exact_arithmetic(problems, solved, decisions):
    """Finals are k/N accuracies stored as float32. Permuted statistics equal in exact arithmetic to the
    observed one, or to the boundary of stage 1, land a few ulps either side of it, differently in each
    unit; taken as ties, the decisions are those of exact arithmetic in every unit. In 5 k (two stages of
    five seeds) every final, mean and statistic is exact. Both cases were decided "smaller" at stage 2
    in fractions; the first was "equal" in percent."""
    cc = _cc(tuple(solved), seeds_per_stage=5, max_stages=2, permutations=100)

    def decided(unit: float) -> list[tuple[str, int]]:
        finals = {arm: {s: float(np.float32(unit * k / problems)) for s, k in enumerate(ks)}
                  for arm, ks in solved.items()}
        return [(p.decision, p.stage) for p in decide(cc, finals).pairs]

    assert decided(1.0) == decided(100.0) == decided(5.0 * problems) == decisions


def _recording(cls: type) -> type:
    """A subclass of ``cls`` that keeps the points (|statistic| of each permutation) each stage reads one
    pair against."""
    class Recording(cls):
        def compute_mean_diffs(self, k, Z):
            out = super().compute_mean_diffs(k, Z)
            self.points = [*getattr(self, "points", []), np.abs(np.asarray(out[str(self.current_comparisons[0])]))]
            return out
    return Recording


def _p_values_step(cls: type, cc: CompareConfig, datasets: int = 6) -> tuple[int, int]:
    """Run one pair's stages through ``_comparator(cc)`` made a recording ``cls``, on finals one standard
    deviation apart, and assert at every stage that the decision is that of a p-value on the grid of
    1/B (B = ``adaptive.permutations``): B points at stage 1, at a later stage those of the stage before
    that its boundary kept; the p-value is the count of points at least the observed statistic over B,
    and the pair is decided when it is within the level the stage spends, in steps of 1/B.
    -> (stages decided, stages that went on)."""
    from exgrpo.compare.adaptive import _comparator

    a, B = cc.adaptive, cc.adaptive.permutations
    outcomes = [0, 0]
    for data in range(datasets):
        rng = np.random.default_rng(data)
        comparator = _comparator(cc)
        comparator.__class__ = _recording(cls)
        values: dict[str, list[float]] = {"grpo": [], "exgrpo": []}
        spent, kept = 0.0, None
        for k in range(a.max_stages):
            values["grpo"] += list(rng.normal(0.0, 1.0, a.seeds_per_stage))
            values["exgrpo"] += list(rng.normal(1.0, 1.0, a.seeds_per_stage))
            comparator.partial_compare({arm: np.asarray(v) for arm, v in values.items()}, verbose=False)
            points = comparator.points[-1]
            assert len(points) == (B if kept is None else kept), (data, k, len(points))
            observed = (k + 1) * abs(np.mean(values["exgrpo"]) - np.mean(values["grpo"]))  # AdaStop's expression
            p_value = np.sum(points >= observed) / B
            step = max(j for j in range(len(points)) if spent + j / B <= a.alpha * (k + 1) / a.max_stages)
            spent += step / B  # the level this stage spends, in AdaStop's own arithmetic
            assert comparator.level_spent == spent, (data, k, comparator.level_spent, spent)
            decided = comparator.decisions[str(comparator.comparisons[0])] in ("larger", "smaller")
            assert decided == (p_value <= step / B), (data, k, p_value, step)
            outcomes[not decided] += 1
            if decided:
                break
            kept = int(np.sum(points <= comparator.boundary[-1][1]))
    return outcomes[0], outcomes[1]


class _KeepsRejected:
    """A broken variant: a later stage extends every point, also those an earlier stage rejected."""

    def compute_mean_diffs(self, k, Z):
        self.boundary = [(low, np.inf) for low, _ in self.boundary]
        return super().compute_mean_diffs(k, Z)


class _Renormalised:
    """A broken variant: a later stage reads its p-values in steps of one over the points it kept."""

    def compute_mean_diffs(self, k, Z):
        out = super().compute_mean_diffs(k, Z)
        self.normalization = len(next(iter(out.values())))
        return out


def test_the_p_values_step_is_one_over_the_permutations_at_every_stage():
    """``adaptive.permutations`` is B, the p-values' step at every stage (the decisions' table says
    "p-values in steps of 1/B"); the check fails on AdaStop's own permutations (at 5 seeds a side it
    enumerates the 252 splits: steps of 1/252) and on two broken variants of the joint ones."""
    from adastop import MultipleAgentsComparator

    from exgrpo.compare.joint_permutation import JointPermutationComparator

    cc = _cc(seeds_per_stage=5, max_stages=4, permutations=500)
    decided, went_on = _p_values_step(JointPermutationComparator, cc)
    assert decided >= 2 and went_on >= 2  # both sides of the threshold, and later stages read the points kept
    for broken in (MultipleAgentsComparator, type("KeepsRejected", (_KeepsRejected, JointPermutationComparator), {}),
                   type("Renormalised", (_Renormalised, JointPermutationComparator), {})):
        with pytest.raises(AssertionError):
            _p_values_step(broken, cc)


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


def test_eight_pairs_against_one_baseline_hold_the_family_wise_error_at_100_permutations():
    """The eight-pair case below at a tenth of its permutations, in ``make test``: 2,000 simulated
    comparisons with no difference, 100 permutations a stage. In steps of 1/100 the four stages spend
    1%, 1%, 1% and 2%: alpha itself. The bound is the count that a true rate of alpha exceeds with
    probability at most 1e-3 (a one-sided binomial quantile: 6.55% of 2,000); a true rate of 7%, as
    AdaStop's per-pair permutations gave, exceeds it with probability 0.77."""
    cc = _cc(("grpo", *(f"arm{i}" for i in range(1, 9))), permutations=100)
    alpha, sims = cc.adaptive.alpha, 2000
    rate, _ = _simulate(np.random.default_rng(80), 0.0, sims, cc)
    assert rate * sims <= stats.binom.ppf(1 - 1e-3, sims, alpha), rate


@pytest.mark.full  # the smaller form above runs in make test
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


@pytest.mark.slow  # trains every stage's runs in local processes
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

