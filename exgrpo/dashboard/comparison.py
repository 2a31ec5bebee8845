"""Comparison report of a compare parent run (``kind=compare``, see exgrpo.compare.tracked).

Read from MLflow only: the parent's tags (arms, baseline, metric) and, for every child run
(one per arm x seed), its ``final/<metric>`` and the per-step histories of the metric,
``batch/solved``, ``pool/*`` and ``replay/started``. The statistics are recomputed from those
with :func:`exgrpo.compare.summarize` (the same code the compare flow logged on the parent) and
checked against what the parent logged.
"""

from __future__ import annotations


from dataclasses import dataclass, field
from typing import Any

import numpy as np

from exgrpo.compare import ArmSummary, RunOutcome, eval_compute, mean_along, summarize
from exgrpo.compare.adaptive import DECISION_WORDS
from exgrpo.dashboard import _html as H
from exgrpo.dashboard._store import DashboardError, children, history, run_link
from exgrpo.errors import redact_uri
from exgrpo.stats import band, mean_ci, steps_to_target
from exgrpo.tracking.mlflow_tracking import sanitize_metric_name


@dataclass
class ChildData:
    run_id: str
    arm: str
    seed: int
    algo: str
    status: str
    final: float | None
    url: str
    curves: dict[str, dict[int, float]] = field(default_factory=dict)


@dataclass
class ComparisonData:
    parent: Any
    tracking_uri: str
    experiment: str
    metric: str
    baseline: str
    arms: list[str]
    children: list[ChildData]
    outcomes: list[RunOutcome]
    rows: list[ArmSummary]
    notes: list[str] = field(default_factory=list)
    adaptive: dict | None = None
    """The sequential test's record of an adaptive comparison (``adaptive.json`` on the parent), else None."""

    @property
    def parent_id(self) -> str:
        return self.parent.info.run_id

    def runs_of(self, arm: str) -> list[ChildData]:
        return sorted((c for c in self.children if c.arm == arm), key=lambda c: c.seed)


def _int(x: Any, default: int = -1) -> int:
    try:
        return int(x)
    except (TypeError, ValueError):
        return default


COMPUTE_KEYS = ("compute/rollout_tokens", "time/step_seconds")
"""The step metrics a child run's compute is summed from (equal-compute readings)."""


def _step_rows(curves: dict[str, dict[int, float]]) -> list[dict[str, float]]:
    """A run's metric histories as step rows in step order (what :func:`eval_compute` reads)."""
    steps = sorted({s for curve in curves.values() for s in curve})
    return [{"step": float(s), **{k: curve[s] for k, curve in curves.items() if s in curve}} for s in steps]


def load_comparison(client: Any, tracking_uri: str, parent: Any) -> ComparisonData:
    tags, params = parent.data.tags, parent.data.params
    if tags.get("kind") != "compare":
        raise DashboardError(f"run {parent.info.run_id} is not a compare parent (tag kind={tags.get('kind')!r})")
    metric = tags.get("metric") or params.get("compare.metric") or "val/accuracy"
    mkey = sanitize_metric_name(metric)
    baseline = tags.get("baseline") or params.get("compare.baseline") or ""
    arms = [a for a in (tags.get("arms") or "").split(",") if a]
    exp = client.get_experiment(parent.info.experiment_id)
    kids: list[ChildData] = []
    notes: list[str] = []
    for run in children(client, parent):
        t = run.data.tags
        arm = t.get("arm")
        if not arm:
            continue
        if arm not in arms:
            arms.append(arm)
        keys = [mkey, "batch/solved", "replay/started", *COMPUTE_KEYS]
        keys += sorted(k for k in run.data.metrics if k.startswith("pool/"))
        curves = {k: history(client, run.info.run_id, k) for k in keys if k in run.data.metrics}
        final = run.data.metrics.get(f"final/{mkey}")
        if final is None and run.info.status == "FINISHED" and curves.get(mkey):
            final = curves[mkey][max(curves[mkey])]  # no final/<metric>: the last evaluation (the last step)
        if run.info.status != "FINISHED" or final is None:
            final = None
            notes.append(f"{arm} seed {t.get('seed')}: status {run.info.status}"
                         + (f" ({t['error'][:200]})" if t.get("error") else "") + "; not in the statistics")
        kids.append(ChildData(run.info.run_id, arm, _int(t.get("seed")), t.get("algo", ""), run.info.status,
                              final, run_link(run, tracking_uri), curves))
    if not kids:
        raise DashboardError(f"compare run {parent.info.run_id} has no child runs yet")
    if baseline and baseline not in arms:
        arms.append(baseline)
    outcomes = []
    for c in kids:
        if c.final is None:
            continue
        curve = c.curves.get(mkey, {})
        steps = sorted(curve)
        outcomes.append(RunOutcome(c.arm, c.seed, c.final, [float(s) for s in steps], [curve[s] for s in steps],
                                   run_id=c.run_id, **eval_compute(_step_rows(c.curves), mkey)))
    rows = summarize(outcomes, arms, baseline or arms[0]) if outcomes else []
    return ComparisonData(parent, tracking_uri, exp.name if exp else "", metric, baseline or arms[0], arms, kids,
                          outcomes, rows, notes, _adaptive_record(client, parent))


def _adaptive_record(client: Any, parent: Any) -> dict | None:
    """``adaptive.json`` of an adaptive comparison's parent run (the test's state after its last
    stage); None for a comparison of fixed seeds, or when the parent has no stage yet."""
    if parent.data.tags.get("adaptive") != "true":
        return None
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(parent.info.run_id, "adaptive.json", tmp)
        except Exception:  # noqa: BLE001 - no stage tested yet
            return None
        with open(path) as f:
            return json.load(f)


def adaptive_section(record: dict) -> str:
    """When each pair was decided: a row per pair, a column per stage (the decision as it stood after
    it), then the stage it was decided at and the seeds it took."""
    history = record.get("history") or []
    rows = []
    for i, p in enumerate(record.get("pairs") or []):
        cells = [H.td(f"{H.esc(p['arm'])} vs {H.esc(p['other'])}", "l")]
        for stage in history:
            d = stage[i]["decision"]
            cells.append(H.td(H.esc(DECISION_WORDS.get(d, d)), None if d == "undecided" else "best"))
        cells += [H.td("—" if p.get("stage") is None else str(p["stage"])), H.td(str(p.get("seeds", ""))),
                  H.td(H.fmt(p.get("mean_diff"), sign=True))]
        rows.append(cells)
    headers = ["pair", *[f"after stage {k + 1}" for k in range(len(history))], "decided at stage", "seeds each",
               "mean diff"]
    status = ("every pair decided" if record.get("finished")
              else f"stage {record.get('stages_done', 0) + 1} next, for {', '.join(record.get('next_arms') or [])}")
    note = ("<p class=\"note\">AdaStop's group-sequential permutation test (<code>exgrpo.compare.adaptive</code>): "
            f"{H.esc(status)}. ahead/behind: the first arm's final value is larger/smaller than the second's, with the "
            "family-wise error held over all pairs and stages; no difference found: undecided after the last stage "
            "(read the CI above for how large a difference the seeds could have missed).</p>")
    return H.table(headers, rows, tid="adaptive-table", left=1) + note


# ------------------------------------------------------------------------------------ curves
def _color(data: ComparisonData, arm: str) -> str:
    return f"C{data.arms.index(arm) % 10}"


def curves_figure(data: ComparisonData) -> str:
    mkey = sanitize_metric_name(data.metric)
    panels = [(mkey, f"{data.metric} (mean, 95% CI band over seeds)")]
    if any("batch/solved" in c.curves for c in data.children):
        panels.append(("batch/solved", "batch pass@1 (mean, 95% CI band over seeds)"))
    by_tokens = {arm: mean_along([o for o in data.outcomes if o.arm == arm], "curve_tokens") for arm in data.arms}
    with_tokens = any(x is not None for x in by_tokens.values())
    fig = H.new_figure(7.2 * (len(panels) + with_tokens), 4.4)
    axes = fig.subplots(1, len(panels) + with_tokens, squeeze=False)[0]
    for ax, (key, title) in zip(axes, panels, strict=False):
        for arm in data.arms:
            runs = [c for c in data.runs_of(arm) if key in c.curves]
            if not runs:
                continue
            steps, mean, lo, hi, _ = band([c.curves[key] for c in runs], key)
            color = _color(data, arm)
            ax.plot(steps, mean, color=color, label=f"{arm} (n={len(runs)})", marker="o" if len(steps) < 30 else None,
                    markersize=3)
            ax.fill_between(steps, lo, hi, color=color, alpha=0.2, linewidth=0)
            if key == mkey and by_tokens.get(arm) is not None and len(by_tokens[arm]) == len(mean):
                x = [t / 1e6 for t in by_tokens[arm]]  # the arm's eval steps that every seed has, as band's
                axes[-1].plot(x, mean, color=color, label=arm, marker="o", markersize=3)
                axes[-1].fill_between(x, lo, hi, color=color, alpha=0.2, linewidth=0)
        ax.set(title=title, xlabel="training step")
    if with_tokens:
        axes[-1].set(title=f"{data.metric} at equal generation compute",
                     xlabel="response tokens sampled so far (M, mean over seeds)")
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    return H.figure_html(fig, "fig-curves", f"Learning curves: {data.metric} per arm, mean over seeds with a 95% "
                         "Student-t band clipped to the metric's possible range (accuracies and pass rates to [0, 1]), "
                         "aligned on the training step" + (", and the same against the response tokens each arm had "
                         "sampled (arms that sample more per step read at equal compute)" if with_tokens else "") + ".",
                         alt=f"learning curves of {data.metric}")


def pool_figure(data: ComparisonData) -> tuple[str, list[str]]:
    """Stacked bucket occupancy and retired/pool size over steps, one row per replay arm."""
    replay = [a for a in data.arms if any(k.startswith("pool/") for c in data.runs_of(a) for k in c.curves)]
    if not replay:
        return "<p class=\"note\">No arm logged pool metrics (no replay arm).</p>", []
    fig = H.new_figure(14, 3.6 * len(replay))
    axes = fig.subplots(len(replay), 2, squeeze=False)
    for (ax_b, ax_r), arm in zip(axes, replay, strict=True):
        runs = data.runs_of(arm)
        bkeys = sorted({k for c in runs for k in c.curves if k.startswith("pool/bucket_")},
                       key=lambda k: _int(k.rsplit("_", 1)[1]))
        if bkeys:
            import matplotlib

            per_bucket = [band([c.curves.get(k, {}) for c in runs], k) for k in bkeys]
            common = sorted(set.intersection(*(set(b[0].tolist()) for b in per_bucket)))
            ys = [np.array([dict(zip(b[0].tolist(), b[1], strict=True))[s] for s in common]) for b in per_bucket]
            cmap = matplotlib.colormaps["viridis"]
            colors = [cmap(i / max(1, len(bkeys) - 1)) for i in range(len(bkeys))]
            ax_b.stackplot(common, *ys, labels=[f"k={k.rsplit('_', 1)[1]}" for k in bkeys], colors=colors, alpha=0.9)
            ax_b.legend(fontsize=7, ncol=2 if len(bkeys) > 8 else 1, loc="upper left", title="bucket (k correct)",
                        title_fontsize=7)
            ax_b.set(title=f"{arm}: pool questions per bucket (mean over {len(runs)} seeds, stacked)",
                     xlabel="training step")
        else:  # e.g. the notebook variant: a pool without buckets
            for key, style in (("pool/questions", "-"), ("pool/trajectories", "--")):
                series = [c.curves[key] for c in runs if key in c.curves]
                if series:
                    steps, mean, lo, hi, _ = band(series, key)
                    ax_b.plot(steps, mean, style, color=_color(data, arm), label=key.split("/")[1])
                    ax_b.fill_between(steps, lo, hi, color=_color(data, arm), alpha=0.15, linewidth=0)
            if ax_b.get_legend_handles_labels()[0]:
                ax_b.legend(fontsize=8)
            ax_b.set(title=f"{arm}: pool size, no buckets (mean over {len(runs)} seeds, 95% CI)",
                     xlabel="training step")
        color = _color(data, arm)
        for key, style, label in (("pool/retired", "-", "retired"), ("pool/questions", "--", "in pool")):
            series = [c.curves[key] for c in runs if key in c.curves]
            if series:
                steps, mean, lo, hi, _ = band(series, key)
                ax_r.plot(steps, mean, style, color=color, label=f"{label} (mean)")
                ax_r.fill_between(steps, lo, hi, color=color, alpha=0.15, linewidth=0)
        ax_r.set(title=f"{arm}: retired questions (—) and pool size (--), 95% CI", xlabel="training step")
        for ax in (ax_b, ax_r):
            ax.grid(alpha=0.3)
        if ax_r.get_legend_handles_labels()[0]:
            ax_r.legend(fontsize=8)
    return H.figure_html(fig, "fig-pool", "Experience-pool dynamics of the replay arms: questions per bucket "
                         "(pool/bucket_<k>) stacked, and pool/retired, pool/questions over steps.",
                         alt="pool dynamics"), replay


# ------------------------------------------------------------------------------------ tables
def _close(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def summary_table(data: ComparisonData) -> str:
    logged = data.parent.data.metrics
    base = data.baseline
    rows = []
    for r in data.rows:
        d = r.diff_vs_baseline
        algo = ",".join(sorted({c.algo for c in data.runs_of(r.arm)}))
        lm = logged.get(sanitize_metric_name(f"{r.arm}/final_mean"))
        if lm is None:
            check = H.td("not logged", "warn", arm=r.arm, col="parent_check")
        elif _close(lm, r.final.mean):
            check = H.td("✓ matches", arm=r.arm, col="parent_check")
        else:
            check = H.td(f"differs: {lm:.4f}", "bad", arm=r.arm, col="parent_check", value=repr(lm))
        diff_html = "—" if d is None else (f"{d.mean:+.4f} [{d.low:+.4f}, {d.high:+.4f}]"
                                           + (" ✱" if d.low > 0 or d.high < 0 else ""))
        reach = r.steps_to_baseline_final
        q, p = r.iqm, r.p_improve
        rows.append([
            H.td(H.esc(r.arm), "l", arm=r.arm, col="arm"),
            H.td(H.esc(algo), "l", arm=r.arm, col="algo"),
            H.td(str(r.final.n), arm=r.arm, col="seeds", value=r.final.n),
            H.td(f"{r.final.mean:.4f} ± {r.final.half_width:.4f}", arm=r.arm, col="final_mean",
                 value=repr(r.final.mean), half_width=repr(r.final.half_width)),
            H.td(f"[{r.final.low:.4f}, {r.final.high:.4f}]", arm=r.arm, col="final_ci",
                 low=repr(r.final.low), high=repr(r.final.high)),
            H.td("—" if q is None else f"{q.mean:.4f} [{q.low:.4f}, {q.high:.4f}]", arm=r.arm, col="iqm",
                 value=None if q is None else repr(q.mean)),
            H.td(diff_html, arm=r.arm, col="diff",
                 value=None if d is None else repr(d.mean), low=None if d is None else repr(d.low),
                 high=None if d is None else repr(d.high), n=None if d is None else d.n),
            H.td("—" if p is None else f"{p.mean:.2f} [{p.low:.2f}, {p.high:.2f}]", arm=r.arm, col="p_improve",
                 value=None if p is None else repr(p.mean)),
            H.td("— (baseline)" if r.arm == base else "never" if reach is None else str(int(reach)),
                 arm=r.arm, col="steps_to_target",
                 value="baseline" if r.arm == base else "never" if reach is None else int(reach)),
            H.td("—" if r.tokens_to_baseline_final is None or r.steps_to_baseline_final is None
                 else f"{r.tokens_to_baseline_final / 1e6:.2f}", arm=r.arm, col="tokens_to_target",
                 value=None if r.tokens_to_baseline_final is None else repr(r.tokens_to_baseline_final)),
            _equal_tokens_cell(r),
            check,
        ])
    headers = ["arm", "algo", "seeds", f"final {data.metric} (mean ± 95% CI)", "95% CI", "IQM [95% bootstrap CI]",
               f"diff vs {base} (paired, 95% CI)", f"P(> {base}) [95% CI]", f"step reaching {base}'s final (median)",
               "tokens sampled then (M)", f"diff vs {base} at equal sampled tokens (paired, 95% CI)",
               "parent run's logged value"]
    return H.table(headers, rows, tid="summary-table", left=2)


def _equal_tokens_cell(r: ArmSummary) -> str:
    """The arm minus the baseline, each seed's pair at the sampled tokens both its runs reached, with its CI."""
    e = r.diff_at_equal_tokens
    if e is None or r.equal_tokens is None:
        return H.td("—", arm=r.arm, col="diff_equal_tokens")
    interval = "(one seed, no interval)" if e.n < 2 else f"[{e.low:+.4f}, {e.high:+.4f}]"
    return H.td(f"{e.mean:+.4f} {interval} at {r.equal_tokens / 1e6:.2f} M"
                + (" ✱" if e.n > 1 and (e.low > 0 or e.high < 0) else ""), arm=r.arm, col="diff_equal_tokens",
                value=repr(e.mean), low=repr(e.low), high=repr(e.high), tokens=repr(r.equal_tokens), n=e.n)


def seeds_table(data: ComparisonData) -> str:
    base_runs = [o.final for o in data.outcomes if o.arm == data.baseline]
    target = mean_ci(base_runs).mean if base_runs else float("nan")
    mkey = sanitize_metric_name(data.metric)
    base_by_seed = {o.seed: o.final for o in data.outcomes if o.arm == data.baseline}
    rows = []
    for arm in data.arms:
        for c in data.runs_of(arm):
            curve = c.curves.get(mkey, {})
            reach = steps_to_target(sorted(curve), [curve[s] for s in sorted(curve)], target) if curve else None
            diff = (c.final - base_by_seed[c.seed]) if (c.final is not None and c.seed in base_by_seed
                                                       and arm != data.baseline) else None
            rows.append([
                H.td(H.esc(arm), "l"), H.td(str(c.seed)),
                H.td(H.fmt(c.final), arm=arm, seed=c.seed, col="seed_final",
                     value=None if c.final is None else repr(c.final)),
                H.td(H.fmt(diff, sign=True)),
                H.td("never" if reach is None else str(int(reach))),
                H.td(H.esc(c.status), None if c.status == "FINISHED" else "bad"),
                H.td(H.link(c.url, c.run_id[:12]), "l"),
            ])
    return H.table(["arm", "seed", f"final {data.metric}", f"− {data.baseline} (same seed)",
                    f"step reaching {data.baseline}'s final", "status", "MLflow run"], rows, tid="seeds-table")


def pool_notes(data: ComparisonData, arms: list[str]) -> str:
    items = []
    for arm in arms:
        runs = data.runs_of(arm)
        started = []
        for c in runs:
            rs = c.curves.get("replay/started")
            if rs is None:
                continue
            first = next((s for s in sorted(rs) if rs[s] >= 0.5), None)
            started.append(f"seed {c.seed}: {'never' if first is None else f'step {first}'}")
        last = {}
        for key in ("pool/questions", "pool/trajectories", "pool/retired"):
            vals = [c.curves[key][max(c.curves[key])] for c in runs if c.curves.get(key)]
            if vals:
                last[key.split("/")[1]] = f"{np.mean(vals):.1f}"
        switch = f"replay switched on at {H.esc(', '.join(started))}; " if started else ""
        items.append(f"<li><b>{H.esc(arm)}</b>: {switch}at the last step (mean over seeds): "
                     f"{H.esc(', '.join(f'{k} {v}' for k, v in last.items()) or '—')}</li>")
    return "<ul class=\"note\">" + "".join(items) + "</ul>"


def render(data: ComparisonData) -> str:
    p = data.parent
    meta = [f"experiment <b>{H.esc(data.experiment)}</b>",
            f"parent run {H.link(run_link(p, data.tracking_uri), p.info.run_id)} ({H.esc(p.info.status)})",
            f"metric <code>{H.esc(data.metric)}</code>", f"baseline <b>{H.esc(data.baseline)}</b>",
            f"store <code>{H.esc(redact_uri(data.tracking_uri))}</code>"]
    n_seeds = sorted({c.seed for c in data.children})
    sections = []
    intro = (f"<p class=\"note\">{len(data.arms)} arms × {len(n_seeds)} seeds ({len(data.children)} child runs). "
             f"Arms: {', '.join(f'<b>{H.esc(a)}</b>' for a in data.arms)}.</p>")
    if data.notes:
        intro += "<ul class=\"err\">" + "".join(f"<li>{H.esc(n)}</li>" for n in data.notes) + "</ul>"
    method = ("<p class=\"note\">Final value: <code>final/" + H.esc(data.metric) + "</code> of each finished child "
              "run. Mean ± 95% Student-t interval over seeds (<code>exgrpo.stats.mean_ci</code>); paired difference "
              f"vs {H.esc(data.baseline)} over the seeds both arms have (<code>exgrpo.stats.paired_difference</code>; "
              "✱: the interval excludes 0); IQM: interquartile mean over seeds with a percentile-bootstrap CI "
              "(<code>exgrpo.stats.iqm_ci</code>); P(&gt; baseline): probability that a run of the arm ends above a "
              "run of the baseline, ties half, bootstrap CI (<code>exgrpo.stats.probability_of_improvement</code>); "
              "step reaching the baseline's mean final value: median over seeds of the "
              "first evaluation step at or above it (<code>exgrpo.stats.steps_to_target</code>), \"never\" when fewer "
              "than half of the seeds reach it (<code>exgrpo.compare.summarize</code>). The last column checks the "
              "recomputed mean against the <code>&lt;arm&gt;/final_mean</code> the compare logged on the parent "
              "run.</p>")
    sections.append(H.section("summary", "Final results", intro + summary_table(data) + method))
    if data.adaptive is not None:
        sections.append(H.section("adaptive", "Sequential test: when each pair was decided", adaptive_section(data.adaptive)))
    sections.append(H.section("curves", "Learning curves", curves_figure(data)))
    pool_html, replay = pool_figure(data)
    sections.append(H.section("pool", "Experience-pool dynamics",
                              pool_html + (pool_notes(data, replay) if replay else "")))
    sections.append(H.section("seeds", "Per-seed runs", seeds_table(data)))
    title = f"Comparison: {data.experiment} — {' vs '.join(data.arms)}"
    return H.page(title, meta, sections, kind="comparison")
