"""Prefect flow: compare algorithms (arms) over seeds; MLflow parent + child runs; a report artifact.

    prefect deployment run 'compare/compare' --param config=experiments/toy.yaml
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.client.orchestration import get_client
from prefect.context import get_run_context
from prefect.states import Completed, Failed, Running

from flows import failed as failed_run
from flows import user_errors
from prefect.cache_policies import NO_CACHE
from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from exgrpo.config import load_compare


def start_span(arm: str, seed: int) -> Any:
    """A task run of ``run_record`` for one (arm, seed), Running from now (the run has just started):
    its start, end and duration in Prefect's UI are the training run's own. None where the flow's
    server cannot take it (the run is then recorded as it ends, by calling the task)."""
    try:
        with get_client(sync_client=True) as client:
            return client.create_task_run(task=run_record, flow_run_id=get_run_context().flow_run.id,
                                          dynamic_key=f"{arm}-seed{seed}", name=f"{arm} seed {seed}", state=Running()).id
    except Exception:  # noqa: BLE001 - a record of its duration is not worth failing the comparison for
        return None


def end_span(task_run_id: Any, state: Any) -> bool:
    """End ``start_span``'s task run in ``state`` (Completed or Failed); False when there is none."""
    if task_run_id is None:
        return False
    try:
        with get_client(sync_client=True) as client:
            client.set_task_run_state(task_run_id, state, force=True)
        return True
    except Exception:  # noqa: BLE001
        return False


def _key(*parts: str) -> str:
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", "-".join(parts).lower())).strip("-")


@task(name="run", task_run_name="{arm} seed {seed}", retries=0, cache_policy=NO_CACHE)
def run_record(arm: str, seed: int, final: float | None = None, error: str | None = None) -> float | None:
    """One (arm, seed) of the comparison as a Prefect task run, recorded as it ends (the training
    itself ran as a Ray task): COMPLETED with its final metric, or FAILED with its error."""
    if error is not None:
        raise RuntimeError(error)
    return final


class _Reporter:
    """What the flow run shows while a comparison trains: the MLflow link once the parent run exists,
    a progress artifact that advances with runs and steps, one task run per (arm, seed) spanning its
    training, and an artifact of the sequential test's decisions per stage."""

    def __init__(self, cc: Any, adaptive: bool, log: Any) -> None:
        self.cc, self.log = cc, log
        a = cc.adaptive
        seeds_each = a.seeds_per_stage * a.max_stages if adaptive else len(cc.seeds)
        self.total = len(cc.arms) * seeds_each  # adaptive: the most it can take
        self.progress = create_progress_artifact(0.0, key=_key(cc.name, "progress"), description=(
            f"runs finished of {self.total} ({', '.join(cc.arms)} x {seeds_each} seeds{', at most' if adaptive else ''})"))
        self.finished: list[Any] = []
        self.shown = {"percent": 0.0, "when": 0.0}
        self.spans: dict[tuple[str, int], Any] = {}  # (arm, seed) -> its task run, Running since the run started

    def started(self, run_id: str, url: str) -> None:  # the MLflow link from the first minute, not only at the end
        create_link_artifact(url, link_text=f"MLflow: compare {self.cc.name} (runs appear as they start)",
                             key=_key(self.cc.name, "mlflow"))

    def run_started(self, arm: str, seed: int) -> None:
        self.spans[(arm, seed)] = start_span(arm, seed)

    def done(self, o: Any) -> None:
        cc, total, shown = self.cc, self.total, self.shown
        self.finished.append(o)
        shown["percent"] = max(shown["percent"], 100.0 * len(self.finished) / total)
        update_progress_artifact(self.progress, shown["percent"],
                                 description=f"{len(self.finished)} of {total} runs finished; last: {o.arm} seed {o.seed}")
        self.log.info("%s seed %d: final %s = %.4f (mlflow run %s)", o.arm, o.seed, cc.metric, o.final, o.run_id)
        if not end_span(self.spans.pop((o.arm, o.seed), None), Completed(message=f"final {cc.metric} = {o.final:.4f}")):
            run_record(o.arm, o.seed, final=o.final)

    def failed(self, arm: str, seed: int, error: str) -> None:  # a failed task run in the UI, the flow goes on
        if not end_span(self.spans.pop((arm, seed), None), Failed(message=error)):
            run_record(arm, seed, error=error, return_state=True)

    def stepped(self, fraction: float) -> None:  # the artifact advances with the runs' steps (at most every 5 s)
        now, shown = time.monotonic(), self.shown
        if 100.0 * fraction > shown["percent"] + 0.5 and now - shown["when"] >= 5.0:
            shown.update(percent=100.0 * fraction, when=now)
            update_progress_artifact(self.progress, shown["percent"], description=(
                f"{len(self.finished)} of {self.total} runs finished; steps {shown['percent']:.0f}% done"))

    def stage(self, state: Any) -> None:  # the sequential test's decisions so far, one artifact updated per stage
        from exgrpo.compare.adaptive import format_decisions

        cc = self.cc
        self.log.info("stage %d tested: %s", state.stages_done,
                      "; ".join(f"{p.arm} vs {p.other}: {p.decision}" for p in state.pairs))
        create_markdown_artifact(f"# {cc.name}: sequential test after stage {state.stages_done}\n\n"
                                 f"{format_decisions(state, cc)}\n", key=_key(cc.name, "adaptive"),
                                 description=f"AdaStop's decisions after stage {state.stages_done}")


def _publish(cc: Any, res: Any, adaptive: bool) -> dict[str, Any]:
    """The comparison's table, its figures (drawn and logged on the parent run by the comparison) and its
    runs' links as artifacts; the flow's return value."""
    links = "\n".join(f"- [{o.arm} seed {o.seed}]({res.child_url(o)}): {o.final:.4f}"
                      for o in sorted(res.outcomes, key=lambda o: (o.arm, o.seed)))
    key = _key(cc.name, "comparison")
    over = "adaptive seeds" if adaptive else f"{len(cc.seeds)} seeds"
    figures = "\n".join(f"- {name}: `{path}` (and the parent run's artifact `{path.rsplit('/', 1)[-1]}`)"
                        for name, path in res.figures.items())
    create_markdown_artifact(
        f"# {cc.name}: {', '.join(cc.arms)} over {over}\n\n{res.table}\n\n"
        f"MLflow parent run: [{res.parent_run_id}]({res.url})\n\n## Figures\n{figures or '(no run finished)'}\n\n"
        f"## Runs\n{links}\n",
        key=key, description=f"{cc.metric}: mean ± 95% CI and paired difference vs {cc.baseline}",
    )
    create_table_artifact(res.table_rows(), key=_key(cc.name, "comparison-table"),
                          description=f"final {cc.metric} per arm")
    return {"parent_run_id": res.parent_run_id, "experiment_id": res.experiment_id, "table": res.table,
            "rows": res.table_rows(), "runs": {f"{o.arm}/seed{o.seed}": o.run_id for o in res.outcomes},
            "outcomes": [dataclasses.asdict(o) for o in res.outcomes],
            "adaptive": None if res.adaptive is None else res.adaptive.to_dict(), "figures": res.figures}


@flow(name="compare", log_prints=True)
def compare_flow(
    config: str = "experiments/toy.yaml",
    seeds: int | str | list[int] | None = None,
    arms: str | list[str] | None = None,
    overrides: dict[str, Any] | None = None,
    tracking_uri: str | None = None,
    executor: str = "ray",
    workers: int | None = None,
    ray_address: str | None = None,
    resume: bool = False,
    adaptive: bool = False,
    new_test: bool = False,
) -> dict[str, Any]:
    """Train every arm of a comparison YAML over seeds (Ray tasks or a process pool), then log the
    statistics on an MLflow parent run and publish the table as Prefect artifacts. ``seeds``: N (0..N-1),
    "A-B" or "a,b,c"; ``arms``: "a,b" (the baseline among them); None: the file's. ``resume``: runs
    with checkpoints continue from them (finished ones end at once), so a killed comparison goes on
    and one with more seeds or steps trains only what is new. ``adaptive``: seeds in stages until
    AdaStop's test decides every pair (the file's ``adaptive:`` section); each stage's decisions are
    an artifact. A resumed adaptive comparison keeps the settings its test began with; ``new_test``
    (with ``resume``) starts a new test over its runs instead."""
    from exgrpo.compare.tracked import run_tracked_compare  # torch: when the flow runs, not when Prefect reads it

    log = get_run_logger()
    try:
        cc = load_compare(config, overrides or {}).select(arms, seeds)
    except user_errors() as e:  # one line in the flow run's state and log, no traceback
        return failed_run(e)
    a = cc.adaptive
    if adaptive:
        log.info("comparing %s adaptively: stages of %d seeds from seed %d, at most %d stages (executor=%s%s)",
                 list(cc.arms), a.seeds_per_stage, a.stage_seeds(0, cc.seeds[0])[0], a.max_stages, executor,
                 ", resuming runs with checkpoints" if resume else "")
    else:
        log.info("comparing %s over seeds %s (%d runs, executor=%s%s)", list(cc.arms), cc.seeds,
                 len(cc.arms) * len(cc.seeds), executor, ", resuming runs with checkpoints" if resume else "")
    shows = _Reporter(cc, adaptive, log)
    try:
        res = run_tracked_compare(cc, tracking_uri=tracking_uri, executor=executor, workers=workers,
                                  ray_address=ray_address, on_done=shows.done, on_parent=shows.started,
                                  on_progress=shows.stepped, on_failed=shows.failed, on_started=shows.run_started,
                                  resume=resume, adaptive=adaptive, on_stage=shows.stage, new_test=new_test)
    except user_errors() as e:
        return failed_run(e)
    if adaptive:  # the test decided before the most seeds it could take: the comparison is done
        update_progress_artifact(shows.progress, 100.0, description=(
            f"{len(shows.finished)} runs finished (at most {shows.total}); "
            f"every pair decided after stage {res.adaptive.stages_done}"))
    return _publish(cc, res, adaptive)


if __name__ == "__main__":
    compare_flow()
