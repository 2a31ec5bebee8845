"""One typed config: the single source of truth for a run.

Every field carries a one-line docstring. YAML files in ``experiments/`` are parsed into
:class:`ExperimentConfig`; ``--set a.b=c`` overrides are applied before validation, so an invalid
run fails before any work starts, with an error that names the field, the bad value and what is
allowed. Prefect parameters, the Optuna search space and MLflow params are derived from here.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from exgrpo.config.adaptive import AdaptiveConfig
from exgrpo.config.algorithm import DEFAULT_REPLAY, AlgorithmConfig, ExGRPOConfig, is_foreign, replay_homes
from exgrpo.config.backend import BackendConfig, check_verl_support
from exgrpo.config.options import (
    RESUME_SAFE,
    RESUME_SAFE_PARAM,
    ConfigError,
    MiniBatchSplit,
    OptimizerKind,
    Tier,
    _Strict,
)
from exgrpo.config.policies import HFPolicyConfig, LMPolicyConfig, MLPPolicyConfig
from exgrpo.config.tasks import FileTaskConfig, ReasoningGymTaskConfig, TextArithmeticTaskConfig, ToyTaskConfig


TaskConfig = Annotated[ToyTaskConfig | TextArithmeticTaskConfig | ReasoningGymTaskConfig | FileTaskConfig,
                       Field(discriminator="kind")]
"""Task section, chosen by ``kind`` (filled in from ``tier`` when absent)."""
PolicyConfig = Annotated[MLPPolicyConfig | LMPolicyConfig | HFPolicyConfig, Field(discriminator="kind")]
"""Policy section, chosen by ``kind`` (filled in from ``tier`` when absent)."""

_TIER_KINDS = {
    "toy": ("toy_arithmetic", "mlp"),
    "tiny-lm": ("text_arithmetic", "lm"),
    "smollm2": ("reasoning_gym", "hf"),
    "hf": ("file", "hf"),
}
"""Default task/policy kinds of each tier with a native backend (the paper tier runs on veRL)."""

_POLICY_SPELLINGS = {"smollm2": {"kind": "hf", "path": "smollm2"}}
"""``policy.kind`` values read as an instance of another kind: SmolLM2 is the hf policy at its packaged
path (the configs saved in run directories and checkpoints of SmolLM2 runs spell it ``kind: smollm2``)."""

_PAIRS = {ToyTaskConfig: (MLPPolicyConfig,), TextArithmeticTaskConfig: (LMPolicyConfig,),
          ReasoningGymTaskConfig: (LMPolicyConfig, HFPolicyConfig), FileTaskConfig: (HFPolicyConfig,)}
"""The policy kinds each task kind can be trained with (a file's chat prompts need the model's own tokenizer)."""


class TrainConfig(_Strict):
    """Optimisation, schedule and checkpointing of the native trainer."""

    batch_size: int = Field(128, ge=1)
    """Questions per training step (B)."""
    epochs: int = Field(50, ge=1, json_schema_extra=RESUME_SAFE_PARAM)
    """Passes over the training questions (fresh draws; steps = epochs * ceil(N_train / B))."""
    max_steps: int | None = Field(None, ge=1, json_schema_extra=RESUME_SAFE_PARAM)
    """Stop after this many steps (a fixed compute budget); None: epochs decide."""
    max_sampled_tokens: int | None = Field(None, ge=1, json_schema_extra=RESUME_SAFE_PARAM)
    """Also stop after the step at which the run's sampled response tokens (compute/rollout_tokens,
    summed) reach this many: a budget of equal generation compute across arms that sample different
    amounts per step (native backend); None: steps alone decide."""
    optimizer: OptimizerKind = OptimizerKind.ADAM
    """Optimiser."""
    lr: float = Field(3e-4, gt=0.0)
    """Learning rate (constant)."""
    weight_decay: float = Field(0.0, ge=0.0)
    """Weight decay (AdamW only)."""
    fused_optimizer: bool = Field(True, json_schema_extra=RESUME_SAFE_PARAM)
    """One fused kernel per optimiser step (torch's fused Adam/AdamW; same update up to float rounding)."""
    mini_batches: int = Field(1, ge=1)
    """Optimiser steps per training step (the batch is split into this many mini-batches)."""
    mini_batch_split: MiniBatchSplit | None = None
    """How the batch is split into ``mini_batches``: ``rows``, a random partition of the rows (a question's
    rollouts spread over the mini-batches), or ``groups``, whole groups (native: in a random order). None: the
    backend's own, ``rows`` on the native backend, ``groups`` on veRL (its actor's mini-batches are slices, in
    batch order, of a group-major batch; it has no other). With ``groups`` a language model's training forward
    (``policy.share_prompt_forward``) runs a question's prompt in one mini-batch rather than in each: faster
    where prompts are long against the responses. Needs ``batch_size >= mini_batches``."""
    grad_clip: float | None = 1.0
    """Max global grad norm; None: no clipping (the norm is still logged)."""
    skip_grad_above: float | None = Field(500.0, gt=0.0)
    """Skip the optimiser step if the grad norm is non-finite or above this (reference: 500; native backend:
    veRL's actor skips only a non-finite norm, and refuses a bound other than the default)."""
    eval_every_epochs: int = Field(1, ge=1, json_schema_extra=RESUME_SAFE_PARAM)
    """Validate every this many epochs (and at the end)."""
    eval_before_train: bool = Field(False, json_schema_extra=RESUME_SAFE)
    """Also validate the initial (warm-start) policy, logged at step 0."""
    eval_every_steps: int | None = Field(None, ge=1, json_schema_extra=RESUME_SAFE_PARAM)
    """Validate every this many steps instead (overrides eval_every_epochs); None: use epochs."""
    checkpoint_every: int = Field(0, ge=0, json_schema_extra=RESUME_SAFE)
    """Write a checkpoint every this many steps (0: only at the end)."""
    keep_last: int | None = Field(None, ge=1, json_schema_extra=RESUME_SAFE)
    """Keep only the newest this many checkpoints (disk stays bounded); None keeps all. Use >= 2 so
    a torn newest one leaves one to resume from."""
    final_checkpoint_optimizer: bool = Field(True, json_schema_extra=RESUME_SAFE)
    """Keep the optimiser's state in a finished run's last checkpoint (native backend). False drops it there
    (AdamW's two moments: two thirds of a checkpoint): the finished run still reads back (``--resume`` ends
    it at once with its record, its policy evaluates and registers), but cannot train past its last step."""
    threads: int = Field(1, ge=1, json_schema_extra=RESUME_SAFE_PARAM)
    """torch intra-op threads of one training process (float sums round differently with the count)."""
    keep_freed_memory: bool = Field(True, json_schema_extra=RESUME_SAFE)
    """Native trainer: malloc keeps freed memory (no per-step page faults on large tensors; RSS stays at its peak)."""
    log_every_steps: int = Field(1, ge=1, json_schema_extra=RESUME_SAFE)
    """Send per-step metrics to MLflow every this many steps (evaluation steps always); metrics.jsonl keeps every step."""

    @field_validator("grad_clip")
    @classmethod
    def _grad_clip_positive(cls, v: float | None) -> float | None:
        if v is not None and not v > 0:
            raise ValueError("must be > 0; null disables clipping")
        return v

    @model_validator(mode="after")
    def _a_group_per_mini_batch(self) -> TrainConfig:
        if self.mini_batch_split is MiniBatchSplit.GROUPS and self.batch_size < self.mini_batches:
            raise ValueError(f"mini_batch_split=groups needs a whole group in each of mini_batches={self.mini_batches}, "
                             f"but batch_size={self.batch_size}: lower train.mini_batches to {self.batch_size} or "
                             "set train.mini_batch_split=rows")
        return self


class ExperimentConfig(_Strict):
    """A run: tier, task, policy, algorithm and training settings."""

    name: str = "toy-exgrpo"
    """Experiment name (the MLflow experiment and the run directory)."""
    tier: Tier = Tier.TOY
    """Model/task tier."""
    seed: int = 0
    """Seed of model init, sampling and replay."""
    output_dir: Path = Field(Path("runs"), json_schema_extra=RESUME_SAFE)
    """Where run directories (checkpoints, metrics) are written."""
    task: TaskConfig = ToyTaskConfig()
    """The task (training questions, validation split, reward)."""
    policy: PolicyConfig = MLPPolicyConfig()
    """The policy model."""
    algorithm: AlgorithmConfig = ExGRPOConfig()
    """The RL algorithm (its class follows algorithm.replay)."""
    train: TrainConfig = TrainConfig()
    """Optimisation and schedule."""
    backend: BackendConfig = BackendConfig()
    """Which trainer runs it (native, or veRL's RayPPOTrainer)."""

    @model_validator(mode="before")
    @classmethod
    def _kinds_from_tier(cls, data: Any) -> Any:
        """Fill in ``task.kind``/``policy.kind`` from ``tier`` so YAML files need not repeat them."""
        if not isinstance(data, dict):
            return data
        tier = str(data.get("tier", Tier.TOY.value))
        if tier not in _TIER_KINDS:
            if tier in {t.value for t in Tier}:
                raise ValueError(f"tier={tier!r} has no native backend yet; use one of {sorted(_TIER_KINDS)}")
            raise ValueError(f"tier={tier!r} is not a tier; use one of {[t.value for t in Tier]}")
        data = dict(data)
        for section, kind in zip(("task", "policy"), _TIER_KINDS[tier], strict=True):
            value = data.get(section)
            if value is None:
                data[section] = {"kind": kind}
            elif isinstance(value, dict) and "kind" not in value:
                data[section] = {"kind": kind, **value}
        policy = data["policy"]
        if isinstance(policy, dict) and policy.get("kind") in _POLICY_SPELLINGS:
            data["policy"] = {**_POLICY_SPELLINGS[policy["kind"]], **{k: v for k, v in policy.items() if k != "kind"}}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> ExperimentConfig:
        if not isinstance(self.policy, _PAIRS[type(self.task)]):
            raise ValueError(
                f"task.kind={self.task.kind!r} cannot be paired with policy.kind={self.policy.kind!r}; "
                f"use one of {[p.model_fields['kind'].default for p in _PAIRS[type(self.task)]]}"
            )
        if isinstance(self.task, FileTaskConfig) and self.task.val_path is None and not self.task.n_val:
            raise ValueError("task.kind=file needs held-out questions to evaluate on: set task.val_path to a "
                             "validation file, or task.n_val to hold that many questions of task.path out")
        if isinstance(self.policy, LMPolicyConfig) and isinstance(self.task, TextArithmeticTaskConfig):
            if self.task.problems != self.policy.model.problems:
                raise ValueError(
                    "task.problems must equal policy.model.problems (the RL questions must come from the "
                    "tiny LM's SFT distribution); set both, or neither"
                )
        if self.backend.name == "verl":
            check_verl_support(self)
        return self

    def run_dir(self) -> Path:
        """Directory of this (experiment, seed) run."""
        return self.output_dir / self.name / f"seed{self.seed}"


class CompareConfig(_Strict):
    """A side-by-side comparison: one base config, named arms of overrides, several seeds."""

    base: dict[str, Any] = {}
    """Settings shared by every arm; an algorithm field applies to the arms whose algorithm has it
    (e.g. experience_ratio to the ExGRPO arms, not to GRPO)."""
    arms: dict[str, dict[str, Any]]
    """Arm name -> dotted overrides of the base (e.g. {"algorithm.replay": "none"})."""
    baseline: str = "grpo"
    """Arm that paired differences are computed against."""
    seeds: list[int] = [0, 1, 2, 3, 4]
    """Seeds run for every arm."""
    metric: str = "val/accuracy"
    """Metric compared at the end of training."""
    adaptive: AdaptiveConfig = AdaptiveConfig()
    """Stages of seeds and the sequential test of ``exgrpo compare --adaptive`` (ignored without it)."""

    @model_validator(mode="after")
    def _arms(self) -> CompareConfig:
        if not self.arms:
            raise ValueError("arms is empty; give at least one arm, e.g. {grpo: {algorithm.replay: none}}")
        if self.baseline not in self.arms:
            raise ValueError(f"baseline={self.baseline!r} is not an arm; arms are {sorted(self.arms)}")
        if not self.seeds:
            raise ValueError("seeds is empty; give at least one seed, e.g. [0, 1, 2]")
        replays = set()
        for arm in self.arms:
            try:
                replays.add(self.arm_config(arm, seed=self.seeds[0]).algorithm.replay.value)
            except ConfigError as e:
                details = [ln.strip() for ln in str(e).splitlines()[1:]] or [str(e)]
                raise ValueError(f"arm {arm!r}: {'; '.join(details)}") from None
        algo = self.base.get("algorithm")
        for name in algo if isinstance(algo, dict) else {}:
            homes = replay_homes(name)
            if homes and not replays & set(homes):
                raise ValueError(f"base sets algorithm.{name}, a setting of replay={'/'.join(homes)}, which no arm "
                                 f"runs (arms run {'/'.join(sorted(replays))}); remove it or add such an arm")
        return self

    def select(self, arms: str | list[str] | None = None, seeds: int | str | list[int] | None = None) -> CompareConfig:
        """This comparison on some of its arms (``"a,b"`` or a list; the baseline among them) and
        seeds (:func:`seed_list`); None keeps the file's. ConfigError naming the arm otherwise."""
        update: dict[str, Any] = {}
        if arms is not None:
            names = [a.strip() for a in arms.split(",")] if isinstance(arms, str) else list(arms)
            unknown = [a for a in names if a not in self.arms]
            if unknown or not names:
                raise ConfigError(f"--arms {','.join(names)}: no arm {', '.join(unknown) or '(empty)'} here; the arms "
                                  f"are {', '.join(self.arms)}")
            if self.baseline not in names:
                raise ConfigError(f"--arms {','.join(names)}: the differences are paired against the baseline "
                                  f"{self.baseline}; add it to --arms")
            update["arms"] = {a: self.arms[a] for a in names}
        if seeds is not None:
            update["seeds"] = seed_list(seeds)
        return self.model_copy(update=update)

    @property
    def name(self) -> str:
        """The comparison's name (the base's ``name``): its MLflow experiment and report directory."""
        return str(self.base.get("name", ExperimentConfig.model_fields["name"].default))

    def base_config(self) -> ExperimentConfig:
        """What every arm shares (tier, task, policy, train, output_dir), as the baseline arm's config
        under the comparison's name (``output_dir / name`` is the comparison's directory)."""
        return self.arm_config(self.baseline, self.seeds[0]).model_copy(
            update={"name": self.name, "output_dir": self._output_root()})

    def _output_root(self) -> Path:
        return Path(str(self.base.get("output_dir", ExperimentConfig.model_fields["output_dir"].default)))

    def arm_config(self, arm: str, seed: int) -> ExperimentConfig:
        """The validated config of one (arm, seed): the base, without the algorithm fields that the
        arm's algorithm does not have, plus the arm's overrides. Its runs live in the comparison's
        directory, ``<output_dir>/<comparison>/<comparison>-<arm>/seed<k>``: never in the directory of a
        single run or of another comparison."""
        overrides = {"output_dir": str(self._output_root() / self.name), **self.arms[arm], "seed": seed,
                     "name": f"{self.name}-{arm}"}
        data = apply_overrides(self.base, overrides)
        algo = data.get("algorithm")
        if isinstance(algo, dict):
            replay = str(algo.get("replay", DEFAULT_REPLAY.value))
            set_by_arm = {k.split(".")[1] for k in self.arms[arm] if k.startswith("algorithm.")}
            if isinstance(self.arms[arm].get("algorithm"), dict):
                set_by_arm |= set(self.arms[arm]["algorithm"])
            data["algorithm"] = {k: v for k, v in algo.items() if k in set_by_arm or not is_foreign(k, replay)}
        return validate_config(ExperimentConfig, data, source=f"arm {arm}")


# --------------------------------------------------------------------------------------------
# Loading, overrides, errors
# --------------------------------------------------------------------------------------------
def seed_list(spec: int | str | list[int]) -> list[int]:
    """The seeds a command names: ``N`` (seeds 0..N-1), ``"A-B"`` (A..B inclusive), ``"a,b,c"`` or a list;
    ConfigError naming the forms otherwise."""
    forms = "use N (seeds 0..N-1), A-B (A..B) or a,b,c, e.g. --seeds 10 or --seeds 100-104"
    if isinstance(spec, list):
        seeds = [int(s) for s in spec]
    else:
        text = str(spec).strip()
        try:
            if text.isdigit():
                seeds = list(range(int(text)))
            elif "-" in text.lstrip("-") and "," not in text:
                lo, hi = text.split("-", 1)
                seeds = list(range(int(lo), int(hi) + 1))
            else:
                seeds = [int(s) for s in text.split(",")]
        except ValueError:
            raise ConfigError(f"--seeds {spec!r}: {forms}") from None
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds {spec!r} names no seeds, a negative one or one twice; {forms}")
    return seeds


def parse_set(items: list[str] | None) -> dict[str, Any]:
    """``["a.b=1", "c=x"]`` -> ``{"a.b": 1, "c": "x"}`` (values parsed as YAML scalars)."""
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set algorithm.experience_ratio=0.25")
        key, value = item.split("=", 1)
        out[key.strip()] = yaml.safe_load(value) if value.strip() else ""
    return out


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Return a copy of ``data`` with dotted-key ``overrides`` applied (unknown keys are kept and
    rejected later by validation, which names them)."""
    data = copy.deepcopy(data)
    for dotted, value in overrides.items():
        node = data
        parts = dotted.split(".")
        for p in parts[:-1]:
            child = node.get(p)
            if not isinstance(child, dict):
                child = {}
                node[p] = child
            node = child
        node[parts[-1]] = value
    return data


def _field_path(loc: tuple[Any, ...], data: Any, missing: bool) -> str:
    """The dotted field name of an error location, without the union tags pydantic inserts
    (``algorithm.buckets.experience_ratio`` -> ``algorithm.experience_ratio``)."""
    parts, node = [], data
    for i, x in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(node, dict) and x not in node and not (last and missing):
            continue  # a tag: the union member, not a key of the input
        parts.append(str(x))
        node = node.get(x) if isinstance(node, dict) else None
    return ".".join(parts) or "<root>"


def _format_validation_error(err: ValidationError, source: str, data: Any = None) -> str:
    lines = [f"invalid config ({source}):"]
    for e in err.errors():
        loc = _field_path(e["loc"], data, e["type"] == "missing") if isinstance(data, dict) else (
            ".".join(str(x) for x in e["loc"]) or "<root>")
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field; check the spelling (see `exgrpo train --help` or exgrpo/config/)"
        bad = e.get("input")
        shown = "" if isinstance(bad, dict) or e["type"] == "missing" else f" (got {bad!r})"
        lines.append(f"  {msg}{shown}" if loc == "<root>" else f"  {loc}: {msg}{shown}")
    return "\n".join(lines)


def validate_config(model: type[BaseModel], data: dict[str, Any], source: str):
    """``model`` validated from the mapping ``data``; a validation error becomes one ConfigError that
    names ``source`` (a file, an arm, a sweep's base) and each bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, source, data)) from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping, with an error naming the path when it is missing or malformed."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p} (give a path to a YAML file, e.g. experiments/toy.yaml)")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def load_experiment(path: str | Path | None, overrides: dict[str, Any] | None = None) -> ExperimentConfig:
    """Load and validate an experiment YAML (its ``base`` if it is a comparison file) plus overrides."""
    data: dict[str, Any] = read_yaml(path) if path is not None else {}
    if "base" in data and "arms" in data:
        data = data["base"]
    data = apply_overrides(data, overrides or {})
    return validate_config(ExperimentConfig, data, source=str(path or "defaults"))


def load_compare(path: str | Path, overrides: dict[str, Any] | None = None) -> CompareConfig:
    """Load and validate a comparison YAML; ``overrides`` apply to ``base`` (dotted keys), those
    under ``adaptive.`` to the comparison's ``adaptive`` section."""
    data = read_yaml(path)
    if "arms" not in data:
        raise ConfigError(f"{path}: a comparison file needs `base:` and `arms:` sections")
    data = dict(data)
    overrides = overrides or {}
    own = {k: v for k, v in overrides.items() if k.startswith("adaptive.")}
    data = apply_overrides(data, own)
    data["base"] = apply_overrides(data.get("base", {}), {k: v for k, v in overrides.items() if k not in own})
    return validate_config(CompareConfig, data, source=str(path))
