"""Prefect flow: an Optuna study (trials as Ray tasks, each an MLflow child run).

    prefect deployment run 'sweep/sweep' --param n_trials=8
"""

from __future__ import annotations

import re
from typing import Any

from prefect import flow, get_run_logger

from flows import failed, user_errors
from exgrpo.errors import redact_uri
from prefect.artifacts import create_link_artifact, create_markdown_artifact

from exgrpo.sweep import load_sweep, run_sweep
from exgrpo.tracking import run_url


def _key(*parts: str) -> str:
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", "-".join(parts).lower())).strip("-")


@flow(name="sweep", log_prints=True)
def sweep_flow(
    config: str = "experiments/toy-sweep.yaml",
    n_trials: int | None = None,
    overrides: dict[str, Any] | None = None,
    storage: str | None = None,
    tracking_uri: str | None = None,
    ray_address: str | None = None,
) -> dict[str, Any]:
    """Run or resume the study of a sweep file until it has ``n_trials`` finished trials.
    ``overrides``: dotted keys into the sweep file (``study.name``, ``budget_steps``,
    ``base.<config field>``, ``space.<field>.<attr>``)."""
    log = get_run_logger()
    try:
        sc = load_sweep(config, overrides or {})  # space errors surface here, before any trial
    except user_errors() as e:  # one line in the flow run's state and log, no traceback
        return failed(e)
    log.info("study %s: %s sampler, %s pruner, budget %d steps, space %s", sc.study.name, sc.study.sampler,
             sc.study.pruner, sc.budget_steps, list(sc.space))

    def on_trial(o):
        log.info("trial %d %s value=%s %s", o["number"], o["state"], o.get("value"), o.get("error") or "")

    try:
        res = run_sweep(sc, storage=storage, tracking_uri=tracking_uri, ray_address=ray_address, n_trials=n_trials,
                        on_trial=on_trial)
    except user_errors() as e:
        return failed(e)
    url = run_url(res.experiment_id, res.parent_run_id, res.tracking_uri)
    best = "\n".join(f"- `{k}` = {v}" for k, v in res.best_params.items()) or "- (no completed trial yet)"
    create_markdown_artifact(
        f"# Study {sc.study.name}\n\nbest {sc.study.metric} = {res.best_value}\n\n{best}\n\n"
        f"best policy: `{res.champion or 'not registered'}` (`exgrpo eval --checkpoint {res.champion}`)\n\n"
        f"trials: {res.counts}\n\n## This run's trials\n{res.table()}\n\nMLflow parent run: [{res.parent_run_id}]({url})\n",
        key=_key("sweep", sc.study.name, "best"), description=f"best trial of study {sc.study.name}",
    )
    create_link_artifact(url, link_text=f"MLflow: study {sc.study.name}", key=_key("sweep", sc.study.name, "mlflow"))
    print(res.table())
    return {"study": res.study_name, "storage": redact_uri(res.storage), "parent_run_id": res.parent_run_id,
            "best_value": res.best_value, "best_params": res.best_params, "counts": res.counts,
            "champion": res.champion,
            "trials": [{k: o.get(k) for k in ("number", "state", "value", "error", "run_id")} for o in res.outcomes]}


if __name__ == "__main__":
    sweep_flow()
