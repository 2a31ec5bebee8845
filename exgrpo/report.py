"""Comparison report: learning curves with 95% CI bands per arm, pool dynamics and the performance
profile of the final scores, as one PNG.

Built from each run's ``metrics.jsonl`` (what the trainer always writes), so it needs no server.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from exgrpo.compare import RunOutcome
from exgrpo.stats import mean_ci, performance_profile


def _read(run_dir: str) -> list[dict[str, float]]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _band(curves: list[tuple[list[float], list[float]]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mean and 95% t-interval across seeds at the steps every seed has."""
    common = sorted(set.intersection(*(set(s) for s, _ in curves)))
    vals = np.array([[dict(zip(s, v, strict=True))[t] for t in common] for s, v in curves])  # (seeds, steps)
    est = [mean_ci(vals[:, j]) for j in range(len(common))]
    return np.array(common), np.array([e.mean for e in est]), np.array([e.low for e in est]), np.array([e.high for e in est])


def comparison_figure(outcomes: Sequence[RunOutcome], arms: Sequence[str], metric: str, out: str | Path) -> Path:
    """Write ``out`` (PNG): left, ``metric`` vs step (mean ± 95% CI over seeds) per arm; middle,
    batch pass@1; then pool size and retired count (paper ExGRPO arms); right, the performance
    profile of the final ``metric``: the fraction of an arm's runs scoring above each threshold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(21, 4.5))
    finals = [o.final for o in outcomes]
    taus = np.linspace(min(finals, default=0.0), max(finals, default=1.0), 101)
    for i, arm in enumerate(arms):
        runs = [o for o in outcomes if o.arm == arm]
        if not runs:
            continue
        color = f"C{i}"
        steps, mean, lo, hi = _band([(o.curve_steps, o.curve_values) for o in runs])
        axes[0].plot(steps, mean, color=color, label=f"{arm} (n={len(runs)})")
        axes[0].fill_between(steps, lo, hi, color=color, alpha=0.2)
        axes[3].step(taus, performance_profile([o.final for o in runs], taus), where="post", color=color, label=arm)
        rows = [_read(o.run_dir) for o in runs if o.run_dir]
        if rows:
            curves = [([r["step"] for r in rr if "batch/solved" in r], [r["batch/solved"] for r in rr if "batch/solved" in r])
                      for rr in rows]
            steps, mean, lo, hi = _band(curves)
            axes[1].plot(steps, mean, color=color, label=arm)
            axes[1].fill_between(steps, lo, hi, color=color, alpha=0.2)
            if any("pool/retired" in r for r in rows[0]):
                for key, style in (("pool/questions", "-"), ("pool/retired", "--")):
                    steps, mean, _, _ = _band([([r["step"] for r in rr if key in r], [r[key] for r in rr if key in r])
                                               for rr in rows])
                    axes[2].plot(steps, mean, style, color=color, label=f"{arm} {key.split('/')[1]}")
    axes[0].set(title=f"{metric} (mean, 95% CI band)", xlabel="step")
    axes[1].set(title="batch pass@1 (mean, 95% CI band)", xlabel="step")
    axes[2].set(title="experience pool: questions (—), retired (--)", xlabel="step")
    if not axes[2].get_lines():
        axes[2].text(0.5, 0.5, "no arm keeps the paper's\nexperience pool", ha="center", va="center",
                     transform=axes[2].transAxes, color="0.4")
    axes[3].set(title=f"performance profile: runs with final {metric} > τ", xlabel="τ", ylabel="fraction of runs",
                ylim=(-0.02, 1.02))
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
