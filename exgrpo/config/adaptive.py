"""How ``exgrpo compare --adaptive`` adds seeds: stages of seeds and AdaStop's sequential test."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

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
    with no true difference is called larger or smaller (checked by simulation at one pair and at eight
    pairs against one baseline, docs/seeds.md)."""
    pairs: Literal["baseline", "all"] = "baseline"
    """Which pairs are tested: each arm against the baseline, or every pair of arms."""
    first_seed: int | None = Field(None, ge=0)
    """First seed of the first stage; None: the first of the file's ``seeds``."""
    permutations: int = Field(10_000, ge=100, le=100_000)
    """AdaStop's B: the permutations each stage's p-values are read from, the observed split among them (at
    stage 1 the identity and B - 1 random permutations of every compared arm's runs pooled; at a later
    stage each point kept is extended by one random permutation of the new runs). p-values move in steps
    of 1/B."""
    test_seed: int = 0
    """Seed of the test's own random permutations: the same runs give the same decisions, also when
    a comparison is resumed."""

    def stage_seeds(self, stage: int, first: int) -> list[int]:
        """The seeds of ``stage`` (counted from 0 here), starting from ``first_seed`` or else ``first``."""
        start = (self.first_seed if self.first_seed is not None else first) + stage * self.seeds_per_stage
        return list(range(start, start + self.seeds_per_stage))
