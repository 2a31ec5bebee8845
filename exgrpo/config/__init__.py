"""One typed config: the single source of truth for a run (see :mod:`exgrpo.config.experiment`).

Sections live in submodules (``options``, ``tasks``, ``policies``, ``algorithm``, ``experiment``);
everything public is re-exported here, so ``from exgrpo.config import X`` is the one import path.
"""

from exgrpo.config.algorithm import AlgorithmConfig, NotebookReplayConfig
from exgrpo.config.backend import BackendConfig, VerlSettings
from exgrpo.config.experiment import (
    CompareConfig,
    ExperimentConfig,
    PolicyConfig,
    TaskConfig,
    TrainConfig,
    _validate,  # noqa: F401  (used by exgrpo.sweep)
    apply_overrides,
    flatten,
    load_compare,
    load_experiment,
    parse_set,
    read_yaml,
)
from exgrpo.config.options import (
    AnswerFormat,
    BucketWeighting,
    ConfigError,
    LossAggregation,
    OptimizerKind,
    ReplayKind,
    SelectionMetric,
    SelectionMode,
    Shaping,
    Tier,
)
from exgrpo.config.policies import LMPolicyConfig, MLPPolicyConfig, SmolLM2PolicyConfig, TinyLMConfig
from exgrpo.config.tasks import (
    ArithmeticProblemsConfig,
    BasicArithmeticKnobs,
    ChainSumKnobs,
    ProductsKnobs,
    ReasoningGymTaskConfig,
    SimpleEquationsKnobs,
    TextArithmeticTaskConfig,
    ToyTaskConfig,
)

__all__ = [
    "AlgorithmConfig",
    "AnswerFormat",
    "BackendConfig",
    "ArithmeticProblemsConfig",
    "BasicArithmeticKnobs",
    "BucketWeighting",
    "ChainSumKnobs",
    "CompareConfig",
    "ConfigError",
    "ExperimentConfig",
    "LMPolicyConfig",
    "LossAggregation",
    "MLPPolicyConfig",
    "NotebookReplayConfig",
    "OptimizerKind",
    "PolicyConfig",
    "ProductsKnobs",
    "ReasoningGymTaskConfig",
    "ReplayKind",
    "SelectionMetric",
    "SelectionMode",
    "Shaping",
    "SimpleEquationsKnobs",
    "SmolLM2PolicyConfig",
    "TaskConfig",
    "TextArithmeticTaskConfig",
    "Tier",
    "TinyLMConfig",
    "ToyTaskConfig",
    "TrainConfig",
    "VerlSettings",
    "apply_overrides",
    "flatten",
    "load_compare",
    "load_experiment",
    "parse_set",
    "read_yaml",
]
