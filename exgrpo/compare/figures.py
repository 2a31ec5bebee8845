"""A comparison's figures: learning curves with 95% CI bands per arm, pool dynamics and the performance
profile of the final scores, as one PNG; and the mechanism behind them (how much of each batch is
replay, the pool's buckets, the importance ratios, the fresh questions each arm saw), as another.

Built from each run's ``metrics.jsonl`` (what the trainer always writes), so it needs no server. The
compare flow draws them at the end of a comparison and logs them on its parent run
(:mod:`exgrpo.compare.tracked`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from exgrpo.compare import RunOutcome, mean_along
from exgrpo.stats import band, performance_profile


def _read(run_dir: str) -> list[dict[str, float]]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _band(curves: list[tuple[list[float], list[float]]], key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mean and 95% t-interval across seeds at the steps every seed has, the interval clipped to what metric
    ``key`` can take (:func:`exgrpo.stats.band`, as the dashboard draws it)."""
    steps, mean, lo, hi, _ = band([dict(zip(s, v, strict=True)) for s, v in curves], key)
    return steps, mean, lo, hi


def _save(fig, axes, out: str | Path) -> Path:
    """Grid and legend on every panel, then the figure written to ``out`` (PNG) and closed."""
    import matplotlib.pyplot as plt

    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def comparison_figure(outcomes: Sequence[RunOutcome], arms: Sequence[str], metric: str, out: str | Path) -> Path:
    """Write ``out`` (PNG). Top: ``metric`` (mean ± 95% CI over seeds) per arm against steps, against
    the response tokens sampled so far and against training minutes (arms that sample more per step
    read at equal compute); bottom: batch pass@1, the pool size and retired count (paper ExGRPO arms)
    and the performance profile of the final ``metric``: the fraction of an arm's runs scoring above
    each threshold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, grid = plt.subplots(2, 3, figsize=(18, 9))
    axes = grid.ravel()
    finals = [o.final for o in outcomes]
    taus = np.linspace(min(finals, default=0.0), max(finals, default=1.0), 101)
    for i, arm in enumerate(arms):
        runs = [o for o in outcomes if o.arm == arm]
        if not runs:
            continue
        color = f"C{i}"
        steps, mean, lo, hi = _band([(o.curve_steps, o.curve_values) for o in runs], metric)
        axes[0].plot(steps, mean, color=color, label=f"{arm} (n={len(runs)})")
        axes[0].fill_between(steps, lo, hi, color=color, alpha=0.2)
        for ax, curve, scale in ((axes[1], "curve_tokens", 1e6), (axes[2], "curve_seconds", 60.0)):
            x = mean_along(runs, curve)
            if x is not None:
                x = np.asarray(x)
                ax.plot(x / scale, mean, color=color, marker=".", label=arm)
                ax.fill_between(x / scale, lo, hi, color=color, alpha=0.2)
        axes[5].step(taus, performance_profile([o.final for o in runs], taus), where="post", color=color, label=arm)
        rows = [_read(o.run_dir) for o in runs if o.run_dir]
        if rows:
            curves = [([r["step"] for r in rr if "batch/solved" in r], [r["batch/solved"] for r in rr if "batch/solved" in r])
                      for rr in rows]
            steps, mean, lo, hi = _band(curves, "batch/solved")
            axes[3].plot(steps, mean, color=color, label=arm)
            axes[3].fill_between(steps, lo, hi, color=color, alpha=0.2)
            if any("pool/retired" in r for r in rows[0]):
                for key, style in (("pool/questions", "-"), ("pool/retired", "--")):
                    steps, mean, _, _ = _band([([r["step"] for r in rr if key in r], [r[key] for r in rr if key in r])
                                               for rr in rows], key)
                    axes[4].plot(steps, mean, style, color=color, label=f"{arm} {key.split('/')[1]}")
    axes[0].set(title=f"{metric} (mean, 95% CI band)", xlabel="step")
    axes[1].set(title=f"{metric} at equal generation compute", xlabel="response tokens sampled so far (M, mean over seeds)")
    axes[2].set(title=f"{metric} at equal training time", xlabel="training minutes so far (mean over seeds)")
    axes[3].set(title="batch pass@1 (mean, 95% CI band)", xlabel="step")
    axes[4].set(title="experience pool: questions (—), retired (--)", xlabel="step")
    for ax, what in ((axes[1], "sampled tokens"), (axes[2], "step times"), (axes[4], "the paper's\nexperience pool")):
        if not ax.get_lines():
            ax.text(0.5, 0.5, f"no arm logs {what}" if ax is not axes[4] else f"no arm keeps {what}",
                    ha="center", va="center", transform=ax.transAxes, color="0.4")
    axes[5].set(title=f"performance profile: runs with final {metric} > τ", xlabel="τ", ylabel="fraction of runs",
                ylim=(-0.02, 1.02))
    return _save(fig, axes, out)


def _mean_curve(rows: list[list[dict[str, float]]], key: str, cumulative: bool = False,
                nonzero: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
    """Mean over runs of ``key`` at the steps every run logged it (summed up to each step with
    ``cumulative``; with ``nonzero``, only steps where it is not 0, e.g. a ratio before there is
    anything to weigh); None if no run logged it."""
    curves = []
    for rr in rows:
        pts = [(r["step"], r[key]) for r in rr if key in r and not (nonzero and r[key] == 0)]
        if not pts:
            return None
        steps, values = zip(*pts, strict=True)
        curves.append((list(steps), list(np.cumsum(values)) if cumulative else list(values)))
    if not curves:
        return None
    common = sorted(set.intersection(*(set(s) for s, _ in curves)))
    vals = np.array([[dict(zip(s, v, strict=True))[t] for t in common] for s, v in curves])
    return np.array(common), vals.mean(0)


def _replayed_token_share(rows: list[list[dict[str, float]]]) -> tuple[np.ndarray, np.ndarray] | None:
    """Mean over runs of the share of the loss's response tokens that were replayed, per step. The
    loss's tokens are the batch's and a replay term's stored responses (``compute/replay_term_tokens``),
    as in the comparison table's "tokens in loss"."""
    rows = [[{**r, "compute/grad_tokens": r["compute/grad_tokens"] + r.get("compute/replay_term_tokens", 0.0)}
             if "compute/grad_tokens" in r else r for r in rr] for rr in rows]
    sampled, in_loss = _mean_curve(rows, "compute/rollout_tokens"), _mean_curve(rows, "compute/grad_tokens")
    if sampled is None or in_loss is None:
        return None
    return sampled[0], 1.0 - sampled[1] / np.maximum(in_loss[1], 1.0)


def mechanism_figure(outcomes: Sequence[RunOutcome], arms: Sequence[str], out: str | Path) -> Path:
    """Write ``out`` (PNG), the why behind a comparison, means over each arm's seeds per step: the
    replayed share of the loss's tokens (and the notebook's replay weight lambda); the pool's
    questions by bucket (latest correct count k of K) for the first arm that keeps the paper's pool;
    the importance ratio of replayed tokens; the questions drawn fresh so far."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(21, 4.5))
    pool_drawn = False
    for i, arm in enumerate(arms):
        rows = [_read(o.run_dir) for o in outcomes if o.arm == arm and o.run_dir]
        if not rows:
            continue
        color = f"C{i}"
        share = _replayed_token_share(rows)
        if share is not None:
            axes[0].plot(*share, color=color, label=f"{arm}: replayed share of tokens")
        lam = _mean_curve(rows, "notebook/lambda")
        if lam is not None:
            axes[0].plot(*lam, "--", color=color, label=f"{arm}: λ, weight of its replay term")
        for key, style in (("actor/off_ratio_mean", "-"), ("notebook/off_w_mean", "--")):
            ratio = _mean_curve(rows, key, nonzero=True)
            if ratio is not None and len(ratio[0]):
                axes[2].plot(*ratio, style, color=color, label=f"{arm} ({key.split('/')[1]})")
        fresh = _mean_curve(rows, "compute/fresh_questions", cumulative=True)
        if fresh is not None:
            axes[3].plot(*fresh, color=color, label=arm)
        keys = sorted((k for k in rows[0][-1] if k.startswith("pool/bucket_")), key=lambda k: int(k.rsplit("_", 1)[1]))
        if keys and not pool_drawn:
            curves = [_mean_curve(rows, k) for k in keys]
            if all(c is not None for c in curves):
                axes[1].stackplot(curves[0][0], *[c[1] for c in curves], labels=[f"k={k.rsplit('_', 1)[1]}" for k in keys],
                                  colors=plt.cm.viridis(np.linspace(0.1, 0.9, len(keys))))
                axes[1].set_title(f"{arm}:\npooled questions by bucket (latest k correct)")
                pool_drawn = True
    axes[0].set(title="replay in each step:\nshare of the loss's tokens (mean over seeds)", xlabel="step", ylim=(-0.02, 1.02))
    if not pool_drawn:
        axes[1].set_title("experience pool by bucket")
        axes[1].text(0.5, 0.5, "no arm keeps the paper's\nexperience pool", ha="center", va="center",
                     transform=axes[1].transAxes, color="0.4")
    axes[1].set_xlabel("step")
    axes[2].set(title="importance ratio of replayed tokens\n(mean, steps that replay)", xlabel="step")
    axes[2].axhline(1.0, color="0.5", lw=0.8)
    axes[3].set(title="questions drawn fresh so far", xlabel="step")
    return _save(fig, axes, out)


FIGURES = {"comparison": "comparison.png", "mechanism": "comparison-mechanism.png"}
"""Each figure of a comparison, and its file in the comparison's directory (and on its MLflow parent run)."""


def draw_figures(outcomes: Sequence[RunOutcome], arms: Sequence[str], metric: str, directory: str | Path
                 ) -> dict[str, str]:
    """Both figures of a comparison into ``directory`` (``<output_dir>/<name>``): name -> path. What the
    compare flow draws and logs on its parent run, and ``exgrpo compare --no-prefect`` draws itself."""
    directory = Path(directory)
    return {"comparison": str(comparison_figure(outcomes, arms, metric, directory / FIGURES["comparison"])),
            "mechanism": str(mechanism_figure(outcomes, arms, directory / FIGURES["mechanism"]))}
