"""ExGRPO Lab: GRPO with experience replay (arXiv 2510.02245), as a small tested core plus backends."""

import os

__version__ = "0.1.0"

# MLflow's usage telemetry is off unless a user turns it on. Besides phoning home, its client unsets an
# environment variable from a background thread when it cannot reach its server (always, offline),
# which races with `requests` iterating os.environ in the run's own logging: a live-metrics
# log-batch then failed with `KeyError: '_MLFLOW_TELEMETRY_SESSION_ID'`. Set before mlflow is imported,
# in every process that imports exgrpo (CLI, Prefect worker, Ray task, veRL job).
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

# transformers goes without scikit-learn, which it would import for nothing exgrpo uses (lean_imports.py)
from exgrpo import lean_imports as _lean_imports  # noqa: E402

_lean_imports.install()
