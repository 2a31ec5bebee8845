"""The best policy of a sweep in the MLflow Model Registry, by name: ``models:/<name>@champion``.

At the end of a sweep the best trial's final checkpoint is logged as an artifact of its MLflow run
(``checkpoint/``; a veRL trial's ``global_step_N/`` as one file of its policy: the merged actor
weights, the run's config and the step) and registered as a version of the model ``exgrpo-<study name>``; the alias
``champion`` points at it (moved when a resumed sweep finds a better trial, left alone when the
best is unchanged). ``exgrpo eval --checkpoint models:/exgrpo-<study>@champion`` evaluates it.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from exgrpo.tracking.finished_run import policy_checkpoint, policy_only
from exgrpo.tracking.mlflow_tracking import Tracker

CHAMPION = "champion"
"""The alias of a sweep's best policy."""
MODELS_PREFIX = "models:/"


def model_name(study_name: str) -> str:
    """The registered model of a study: ``exgrpo-<study name>`` with registry-safe characters."""
    return "exgrpo-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", study_name).strip("-")


def register_champion(client: Any, study_name: str, run_id: str, checkpoint: str | Path,
                      tags: dict[str, str] | None = None) -> tuple[str, str]:
    """Register ``checkpoint`` (the best trial's, from run ``run_id``) and point ``champion`` at
    it; returns (model name, version). Idempotent for the same run."""
    from mlflow.exceptions import MlflowException

    name = model_name(study_name)
    try:
        current = client.get_model_version_by_alias(name, CHAMPION)
        if current.run_id == run_id:
            return name, str(current.version)
    except MlflowException:  # no model or no alias yet
        pass
    path = Path(checkpoint)
    if not path.exists():
        raise FileNotFoundError(f"the best trial's checkpoint {path} is missing; nothing to register")
    path = policy_checkpoint(path)  # veRL's global_step_N: its policy (merged FSDP shards + config) as one file
    with policy_only(path) as policy:
        client.log_artifact(run_id, str(policy), "checkpoint")
    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(name, description=f"best policy of the exgrpo sweep {study_name!r}")
    version = client.create_model_version(name, source=f"runs:/{run_id}/checkpoint", run_id=run_id,
                                          tags={"file": path.name, **(tags or {})})
    client.set_registered_model_alias(name, CHAMPION, version.version)
    return name, str(version.version)


def resolve_checkpoint(spec: str, tracking_uri: str | None = None, dst_dir: str | Path | None = None) -> Path:
    """A checkpoint path, or a registered one (``models:/<name>@<alias>`` or ``models:/<name>/<version>``)
    downloaded from MLflow into ``dst_dir`` (default: a new temporary directory, the caller's to
    remove; :func:`checkpoint_at` removes it)."""
    if not spec.startswith(MODELS_PREFIX):
        return Path(spec)
    import mlflow

    tracker = Tracker(tracking_uri)  # a store it cannot use: one line now, not MLflow's retries for minutes
    uri, client = tracker.uri, tracker.client
    ref = spec[len(MODELS_PREFIX):]
    if "@" in ref:
        name, alias = ref.split("@", 1)
        version = client.get_model_version_by_alias(name, alias)
    else:
        name, _, number = ref.partition("/")
        version = client.get_model_version(name, number)
    where = mlflow.artifacts.download_artifacts(artifact_uri=version.source, tracking_uri=uri,
                                                dst_path=str(dst_dir or tempfile.mkdtemp(prefix="exgrpo-model-")))
    return Path(where) / version.tags.get("file", "")


@contextlib.contextmanager
def checkpoint_at(spec: str, tracking_uri: str | None = None) -> Iterator[Path]:
    """:func:`resolve_checkpoint` for the length of a ``with`` block: a registered checkpoint is
    downloaded into a temporary ``exgrpo-model-*`` directory that is removed when the block ends (a
    path is used where it is)."""
    if not spec.startswith(MODELS_PREFIX):
        yield Path(spec)
        return
    download = tempfile.mkdtemp(prefix="exgrpo-model-")
    try:
        yield resolve_checkpoint(spec, tracking_uri, dst_dir=download)
    finally:
        shutil.rmtree(download, ignore_errors=True)


__all__ = ["CHAMPION", "checkpoint_at", "model_name", "register_champion", "resolve_checkpoint"]
