"""How ``exgrpo compare --adaptive`` adds seeds: stages of seeds and AdaStop's sequential test."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from exgrpo.config.options import _Strict


class AdaptiveConfig(_Strict):
    """The ``adaptive:`` section of a comparison file: stages of seeds for every arm still undecided,
    each stage followed by AdaStop's group-sequential permutation test (arXiv 2306.10882), until
    every pair is decided or the stages run out. Used by ``exgrpo compare --adaptive``."""

    seeds_per_stage: int = Field(5, ge=2, le=50)
    """Seeds each undecided arm runs per stage (AdaStop's n): stage k = 1, 2, ... runs seeds
    first_seed + (k-1)*n to first_seed + k*n - 1."""
    max_stages: int = Field(4, ge=1, le=20)
    """Most stages (AdaStop's K): an arm runs at most seeds_per_stage * max_stages seeds. A pair still
    undecided after the last stage ends "no difference found"."""
    alpha: float = Field(0.05, gt=0.0, lt=0.5)
    """Family-wise error rate over all the pairs compared and all the stages: the chance that any pair
    with no true difference is called larger or smaller (held for one pair; about 0.07 was measured at
    0.05 for eight pairs, docs/seeds.md)."""
    pairs: Literal["baseline", "all"] = "baseline"
    """Which pairs are tested: each arm against the baseline, or every pair of arms."""
    first_seed: int | None = Field(None, ge=0)
    """First seed of the first stage; None: the first of the file's ``seeds``."""
    permutations: int = Field(10_000, ge=100, le=1_000_000)
    """AdaStop's B, a bound on the permutations per stage, not their number. Stage 1 takes every split of
    its runs, C(2n, n) with n = seeds_per_stage, and B must exceed it; a later stage multiplies them by
    the new block's C(2n, n) only while the product stays under B, else it pairs each split held with
    one random split. At n = 5 that is 252 at every stage for any B from 253 to 63,503: p-values move in
    steps of 1/252 (the decisions' table gives the step); a B over 63,504 gives stage 2 63,504."""
    test_seed: int = 0
    """Seed of the test's own random permutations: the same runs give the same decisions, also when
    a comparison is resumed."""

    @model_validator(mode="after")
    def _every_split_of_a_stage(self) -> "AdaptiveConfig":
        # AdaStop 0.1.3 with B at or under C(2n, n) samples stage 1's splits and then counts every later
        # stage's permutation distribution as holding one value, so its thresholds are no longer p-values
        splits = math.comb(2 * self.seeds_per_stage, self.seeds_per_stage)
        if self.permutations <= splits:
            raise ValueError(f"adaptive.permutations={self.permutations} must exceed the {splits} splits of a stage of "
                             f"{self.seeds_per_stage} seeds per arm (C({2 * self.seeds_per_stage}, {self.seeds_per_stage})); "
                             f"set adaptive.permutations={splits + 1} or more, or fewer adaptive.seeds_per_stage")
        return self

    def stage_seeds(self, stage: int, first: int) -> list[int]:
        """The seeds of ``stage`` (counted from 0 here), starting from ``first_seed`` or else ``first``."""
        start = (self.first_seed if self.first_seed is not None else first) + stage * self.seeds_per_stage
        return list(range(start, start + self.seeds_per_stage))
