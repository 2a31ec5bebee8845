"""Adaptive seeds: stages of seeds, each followed by AdaStop's group-sequential permutation test.

A comparison run with ``--adaptive`` trains ``adaptive.seeds_per_stage`` seeds of every arm, tests
every pair (each arm against the baseline, or all pairs), and runs the next stage only for the arms
of pairs still undecided, until every pair is decided or ``adaptive.max_stages`` stages have run.
The test is AdaStop (Mathieu et al., arXiv 2306.10882, the ``adastop`` package): it controls the
family-wise error over all pairs and all stages, which reading a CI after every new seed does not.

The decisions are a pure function of the runs' final metrics: :func:`decide` replays the test stage
by stage from them, so a resumed comparison reaches the same decisions without any saved state.

Orchestration-free: the caller trains a stage through a callable (local processes or Ray tasks).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

import numpy as np

from exgrpo.config import CompareConfig

DECIDED = ("larger", "smaller", "equal")
"""AdaStop's decisions: the first arm of the pair is larger or smaller than the second, or no
difference was found at the test's level within the stages (``equal``)."""
DECISION_WORDS = {"larger": "ahead", "smaller": "behind", "equal": "no difference found", "undecided": "undecided"}
"""How the table and the dashboard say each decision (the first arm of the pair against the second)."""


@dataclass
class PairDecision:
    """One tested pair, ``arm`` against ``other`` (the baseline when pairs are against it)."""

    arm: str
    other: str
    decision: str = "undecided"
    """``larger`` / ``smaller`` (``arm`` against ``other``), ``equal`` (no difference found by the last
    stage), or ``undecided`` (more stages to run)."""
    stage: int | None = None
    """The stage (1-based) at which the pair was decided; None while undecided."""
    seeds: int = 0
    """Seeds of each of the two arms that the decision rests on."""
    mean_diff: float = math.nan
    """Mean of ``arm`` minus mean of ``other`` over those seeds."""


@dataclass
class SequentialState:
    """Where an adaptive comparison stands after the stages its runs complete."""

    stages_done: int
    pairs: list[PairDecision]
    finished: bool
    next_arms: list[str] = field(default_factory=list)
    """Arms that run the next stage (empty when finished)."""
    next_seeds: list[int] = field(default_factory=list)
    """The next stage's seeds."""
    history: list[list[PairDecision]] = field(default_factory=list)
    """The pairs as they stood after each completed stage."""

    def to_dict(self) -> dict:
        return asdict(self)

    def seeds_of(self, arm: str) -> int:
        """Seeds ``arm`` has run in the completed stages."""
        return max((p.seeds for p in self.pairs if arm in (p.arm, p.other)), default=0)


def compared_pairs(cc: CompareConfig) -> list[tuple[str, str]]:
    """The pairs tested: (arm, baseline) for every other arm, or every (a, b) in the file's arm order."""
    arms = list(cc.arms)
    if cc.adaptive.pairs == "all":
        return [(a, b) for i, a in enumerate(arms) for b in arms[i + 1:]]
    return [(a, cc.baseline) for a in arms if a != cc.baseline]


def _comparator(cc: CompareConfig):
    """The sequential test of this comparison: AdaStop with a joint, two-sided permutation distribution
    (:mod:`exgrpo.compare.joint_permutation`, imported where it is used: it imports matplotlib), given the
    family-wise ``adaptive.alpha`` itself. ``tests/test_adaptive.py`` checks its error rate at one pair
    and at eight pairs against one baseline by simulation."""
    from exgrpo.compare.joint_permutation import JointPermutationComparator, as_pairs

    arms = list(cc.arms)
    pairs = as_pairs([(arms.index(a), arms.index(b)) for a, b in compared_pairs(cc)])
    a = cc.adaptive
    return JointPermutationComparator(n=a.seeds_per_stage, K=a.max_stages, B=a.permutations, comparisons=pairs,
                                      alpha=a.alpha, beta=0.0, seed=a.test_seed)


def decide(cc: CompareConfig, finals: dict[str, dict[int, float]]) -> SequentialState:
    """Replay the sequential test over every stage whose runs ``finals`` (arm -> seed -> final metric)
    complete, and say what runs next. A stage is complete when every arm still undecided after the
    previous stage has a final for each of the stage's seeds."""
    a, arms = cc.adaptive, list(cc.arms)
    pairs = [PairDecision(x, y) for x, y in compared_pairs(cc)]
    first = cc.seeds[0]
    comparator = _comparator(cc)
    values: dict[str, list[float]] = {arm: [] for arm in arms}
    history: list[list[PairDecision]] = []
    for stage in range(a.max_stages):
        active = [arm for arm in arms if any(p.decision == "undecided" and arm in (p.arm, p.other) for p in pairs)]
        seeds = a.stage_seeds(stage, first)
        if any(s not in finals.get(arm, {}) for arm in active for s in seeds):
            return SequentialState(stage, pairs, False, active, seeds, history)
        for arm in active:
            values[arm] += [float(finals[arm][s]) for s in seeds]
        comparator.partial_compare({arm: np.asarray(v, dtype=float) for arm, v in values.items()}, verbose=False)
        for row, p in zip(comparator.comparisons, pairs, strict=True):
            if p.decision != "undecided":
                continue
            p.seeds = len(values[p.arm])
            p.mean_diff = float(np.mean(values[p.arm]) - np.mean(values[p.other]))
            decision = comparator.decisions[str(row)]
            if decision in DECIDED:
                p.decision, p.stage = decision, stage + 1
        history.append([PairDecision(**asdict(p)) for p in pairs])
        if all(p.decision != "undecided" for p in pairs):
            return SequentialState(stage + 1, pairs, True, history=history)
    return SequentialState(a.max_stages, pairs, True, history=history)  # unreachable: the last stage decides all


def finals_of(outcomes: Iterable) -> dict[str, dict[int, float]]:
    """arm -> seed -> final metric of finished runs (:class:`exgrpo.compare.RunOutcome`)."""
    out: dict[str, dict[int, float]] = {}
    for o in outcomes:
        out.setdefault(o.arm, {})[o.seed] = o.final
    return out


def stage_config(cc: CompareConfig, state: SequentialState) -> CompareConfig:
    """The comparison restricted to the next stage: its arms and its seeds."""
    return cc.model_copy(update={"arms": {a: cc.arms[a] for a in state.next_arms}, "seeds": list(state.next_seeds)})


class StageIncomplete(RuntimeError):
    """A stage's runs did not all finish (some failed): the test cannot go on without them.
    ``outcomes``: every run that finished; ``state``: the decisions they support."""

    def __init__(self, message: str, outcomes: list, state: SequentialState) -> None:
        super().__init__(message)
        self.outcomes, self.state = outcomes, state


def run_adaptive(cc: CompareConfig, run_stage: Callable[[CompareConfig], list], outcomes: Iterable = (),
                 on_stage: Callable[[SequentialState], None] | None = None) -> tuple[list, SequentialState]:
    """Run stages through ``run_stage`` (a comparison restricted to a stage's arms and seeds -> the
    outcomes it finished) until :func:`decide` says every pair is decided. ``outcomes``: runs already
    finished (resumed ones count). ``on_stage(state)`` after each stage tested. Raises
    :class:`StageIncomplete` when a stage's runs did not all finish."""
    outcomes = list(outcomes)
    told = 0
    while True:
        state = decide(cc, finals_of(outcomes))
        if on_stage is not None and state.stages_done > told:
            for k in range(told, state.stages_done):  # every stage once, also those already run before a resume
                on_stage(SequentialState(k + 1, state.history[k], state.finished and k + 1 == state.stages_done,
                                         history=state.history[:k + 1]))
            told = state.stages_done
        if state.finished:
            return outcomes, state
        new = run_stage(stage_config(cc, state))
        outcomes += new
        have = finals_of(outcomes)
        missing = [f"{arm} seed {s}" for arm in state.next_arms for s in state.next_seeds if s not in have.get(arm, {})]
        if missing:
            raise StageIncomplete(f"stage {state.stages_done + 1} is incomplete ({', '.join(missing)} did not finish); "
                                  "the sequential test needs every run of a stage: fix the cause, then --resume",
                                  outcomes, state)


def format_decisions(state: SequentialState, cc: CompareConfig) -> str:
    """The test's record as a Markdown table: each pair's decision, the stage and seeds it took, and
    a legend."""
    a = cc.adaptive
    lines = ["| pair | decision | decided at stage | seeds each | mean diff |", "|---|---|---|---|---|"]
    for p in state.pairs:
        stage = "—" if p.stage is None else str(p.stage)
        diff = "—" if math.isnan(p.mean_diff) else f"{p.mean_diff:+.4f}"
        lines.append(f"| {p.arm} vs {p.other} | {DECISION_WORDS[p.decision]} | {stage} | {p.seeds} | {diff} |")
    status = "every pair decided" if state.finished else f"next: stage {state.stages_done + 1} for {', '.join(state.next_arms)}"
    lines += ["", f"AdaStop (joint permutations) over {state.stages_done} of at most {a.max_stages} stages of {a.seeds_per_stage} seeds, "
              f"family-wise error {a.alpha:g} over {len(state.pairs)} pair(s), p-values in steps of 1/{a.permutations}; {status}. "
              "ahead/behind: the first arm's final metric is larger/smaller than the second's; no difference found: "
              "not decided within the stages (not proof that the arms are equal: read the CI for its size)."]
    return "\n".join(lines)
