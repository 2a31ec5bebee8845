"""exgrpo.dashboard on a real small compare (2 arms x 2 seeds) and a real 3-trial sweep: real MLflow
sqlite, real Optuna sqlite, real local Ray (2 CPUs); the reports are served on 127.0.0.1 and
rendered by headless Debian Chromium (``--dump-dom``).

Chromium: ``scripts/setup-chromium.sh`` (or ``EXGRPO_CHROMIUM=/path/to/chromium``). Without it the
browser tests skip, unless ``EXGRPO_REQUIRE_BROWSER`` is set (CI), where they fail.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

mlflow = pytest.importorskip("mlflow")
optuna = pytest.importorskip("optuna")
pytest.importorskip("ray")
pytest.importorskip("matplotlib")

if "RAY_TMPDIR" not in os.environ:  # short: Ray's unix socket paths are length-limited
    os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    atexit.register(shutil.rmtree, os.environ["RAY_TMPDIR"], True)

from browser import dump_dom, find_chromium  # noqa: E402
from exgrpo.dashboard import DashboardError, build_report, build_sweep_report, start_server  # noqa: E402
from exgrpo.stats import mean_ci, paired_difference  # noqa: E402

TINY = {"task.max_operand": 5, "train.batch_size": 16, "algorithm.group_size": 4, "policy.hidden": 32,
        "policy.layers": 2, "train.lr": 1e-2}


# ------------------------------------------------------------------ a real compare and a real sweep
@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """One MLflow store holding a compare (grpo vs exgrpo x seeds 0, 1) and a 3-trial study."""
    from exgrpo.config import load_compare
    from exgrpo.sweep import load_sweep, run_sweep
    from exgrpo.compare.tracked import run_tracked_compare

    tmp = tmp_path_factory.mktemp("dash")
    uri = f"sqlite:///{tmp}/mlruns/mlflow.db"
    t0 = time.perf_counter()
    cc = load_compare("experiments/toy.yaml", {**TINY, "train.max_steps": 24, "algorithm.replay_start_pass_rate": 0.0,
                                               "output_dir": str(tmp / "runs"), "name": "dash-cmp"})
    cc = cc.model_copy(update={"arms": {"grpo": cc.arms["grpo"], "exgrpo": cc.arms["exgrpo"]}, "seeds": [0, 1]})
    cmp = run_tracked_compare(cc, tracking_uri=uri, executor="ray")
    t1 = time.perf_counter()
    storage = f"sqlite:///{tmp}/optuna.db"
    sc = load_sweep({
        "study": {"name": "dash-study", "n_trials": 3, "parallel": 2, "pruner": "none", "n_startup_trials": 10,
                  "enqueue_defaults": False,
                  "enqueue": [{"train.lr": 0.001, "algorithm.experience_ratio": 0.5},
                              {"train.lr": 0.03, "algorithm.experience_ratio": 0.25}]},
        "base": "experiments/toy.yaml",
        "base_overrides": {**TINY, "name": "dash-sweep", "algorithm.replay": "buckets",
                           "algorithm.replay_start_pass_rate": 0.0, "output_dir": str(tmp / "runs")},
        "budget_steps": 24,
        "space": {"train.lr": {"type": "float", "low": 0.001, "high": 0.03, "log": True},
                  "algorithm.experience_ratio": {"type": "float", "low": 0.1, "high": 0.9}},
    })
    sw = run_sweep(sc, storage=storage, tracking_uri=uri)
    print(f"\nfixture: compare {t1 - t0:.1f} s, sweep {time.perf_counter() - t1:.1f} s")
    return SimpleNamespace(tmp=tmp, uri=uri, cmp=cmp, sw=sw, storage=storage)


def expected_rows(cmp) -> dict[str, dict]:
    """The table recomputed with exgrpo.stats straight from the compare's own outcomes."""
    by = {}
    for o in cmp.outcomes:
        by.setdefault(o.arm, {})[o.seed] = o
    out = {}
    for arm, runs in by.items():
        est = mean_ci([runs[s].final for s in sorted(runs)])
        base = by[cmp.baseline]
        seeds = sorted(set(runs) & set(base))
        diff = None if arm == cmp.baseline else paired_difference([runs[s].final for s in seeds],
                                                                  [base[s].final for s in seeds])
        reach = next(r.steps_to_baseline_final for r in cmp.rows if r.arm == arm)
        out[arm] = {"est": est, "diff": diff, "reach": reach}
    return out


# ------------------------------------------------------------------ DOM helpers
class Dom(HTMLParser):
    """The elements a test looks at: every element's attributes, the text of cells, the page text."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.cells: list[tuple[dict[str, str], str]] = []
        self._cell: tuple[dict[str, str], list[str]] | None = None
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        self.elements.append((tag, a))
        if tag == "td":
            self._cell = (a, [])

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self.cells.append((self._cell[0], "".join(self._cell[1]).strip()))
            self._cell = None

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell[1].append(data)

    def all_text(self) -> str:
        return " ".join(self.text)

    def tags(self, tag: str) -> list[dict[str, str]]:
        return [a for t, a in self.elements if t == tag]

    def cell(self, **match: str) -> tuple[dict[str, str], str]:
        hits = [(a, t) for a, t in self.cells if all(a.get(f"data-{k.replace('_', '-')}") == str(v)
                                                       for k, v in match.items())]
        assert len(hits) == 1, (match, hits)
        return hits[0]


def assert_self_contained(dom: Dom) -> None:
    assert not dom.tags("link"), "no external stylesheet"
    assert all("src" not in s for s in dom.tags("script")), "no external script"
    imgs = dom.tags("img")
    assert imgs and all(i["src"].startswith("data:image/png;base64,") for i in imgs)
    (csp,) = [m for m in dom.tags("meta") if m.get("http-equiv") == "Content-Security-Policy"]
    assert "default-src 'none'" in csp["content"]


def check_comparison_dom(dom: Dom, cmp, rendered: bool) -> None:
    text = dom.all_text()
    for arm, exp in expected_rows(cmp).items():
        assert arm in text
        est, diff = exp["est"], exp["diff"]
        a, t = dom.cell(arm=arm, col="final_mean")
        assert t == f"{est.mean:.4f} ± {est.half_width:.4f}"
        assert float(a["data-value"]) == pytest.approx(est.mean, rel=1e-12, abs=1e-12)
        assert float(a["data-half-width"]) == pytest.approx(est.half_width, rel=1e-9, abs=1e-12)
        a, t = dom.cell(arm=arm, col="final_ci")
        assert t == f"[{est.low:.4f}, {est.high:.4f}]"
        assert int(dom.cell(arm=arm, col="seeds")[1]) == est.n == 2
        a, t = dom.cell(arm=arm, col="diff")
        if diff is None:
            assert arm == cmp.baseline and t == "—"
        else:
            assert t.startswith(f"{diff.mean:+.4f} [{diff.low:+.4f}, {diff.high:+.4f}]")
            assert float(a["data-value"]) == pytest.approx(diff.mean, rel=1e-12, abs=1e-12)
        reach = exp["reach"]
        shown = "— (baseline)" if arm == cmp.baseline else "never" if reach is None else str(int(reach))
        assert dom.cell(arm=arm, col="steps_to_target")[1] == shown  # as the CLI's table says
        assert dom.cell(arm=arm, col="parent_check")[1] == "✓ matches"
        for o in (o for o in cmp.outcomes if o.arm == arm):
            a, t = dom.cell(arm=arm, seed=o.seed, col="seed_final")
            assert t == f"{o.final:.4f}"
    ids = {a.get("id") for _, a in dom.elements}
    assert {"summary", "curves", "pool", "seeds", "fig-curves", "fig-pool", "summary-table"} <= ids
    assert "replay switched on" in text
    assert_self_contained(dom)
    if rendered:
        body = dom.tags("body")[0]
        assert body.get("data-ready") == "1"
        imgs = dom.tags("img")
        assert int(body["data-images-rendered"]) == len(imgs) == 2
        assert all(int(i["data-natural-width"]) > 300 for i in imgs), imgs


def check_sweep_dom(dom: Dom, study, rendered: bool) -> None:
    best = study.best_trial
    assert dom.tags("span") and any(s.get("id") == "best-trial" and s.get("data-value") == str(best.number)
                                    for s in dom.tags("span"))
    for k, v in best.params.items():
        a, t = dom.cell(param=k, col="best_param")
        assert t == (f"{v:.6g}" if isinstance(v, float) else str(v))
        if isinstance(v, float):
            assert float(a["data-value"]) == pytest.approx(v, rel=1e-12)
    trials = study.get_trials()
    assert len(trials) == 3
    for t in trials:
        assert dom.cell(trial=t.number, col="state")[1] == t.state.name
        if t.value is not None:
            assert float(dom.cell(trial=t.number, col="value")[0]["data-value"]) == pytest.approx(t.value, rel=1e-12)
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    if len({t.value for t in complete}) >= 2:
        imp = optuna.importance.get_param_importances(
            study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0))
        for k, v in imp.items():
            assert float(dom.cell(param=k, col="importance")[0]["data-value"]) == pytest.approx(v, rel=1e-9)
        n_img = 2
    else:
        assert "importances are undefined" in dom.all_text() or "at least 2 complete" in dom.all_text()
        n_img = 1
    assert_self_contained(dom)
    if rendered:
        body = dom.tags("body")[0]
        assert body.get("data-ready") == "1" and body.get("data-report") == "sweep"
        assert int(body["data-images-rendered"]) == len(dom.tags("img")) == n_img


# ------------------------------------------------------------------ browser
@pytest.fixture(scope="session")
def chromium() -> str:
    return find_chromium()


# ------------------------------------------------------------------ tests
def test_comparison_report_from_mlflow(lab):
    rep = build_report(lab.cmp.parent_run_id, tracking_uri=lab.uri)
    assert rep.kind == "comparison" and rep.run_id == lab.cmp.parent_run_id
    d = rep.data
    assert d.arms == ["grpo", "exgrpo"] and d.baseline == "grpo" and d.metric == "val/accuracy"
    assert len(d.children) == 4 and not d.notes
    # the statistics recomputed from MLflow are the compare's own, to the bit
    assert [(r.arm, r.final, r.diff_vs_baseline, r.steps_to_baseline_final) for r in d.rows] == [
        (r.arm, r.final, r.diff_vs_baseline, r.steps_to_baseline_final) for r in lab.cmp.rows]
    # learning curves: the MLflow history is the trainer's eval curve
    for o in lab.cmp.outcomes:
        (c,) = [c for c in d.children if c.run_id == o.run_id]
        assert sorted(c.curves["val/accuracy"]) == o.curve_steps
        assert [c.curves["val/accuracy"][s] for s in sorted(c.curves["val/accuracy"])] == o.curve_values
        if o.arm == "exgrpo":
            assert {"pool/bucket_1", "pool/bucket_2", "pool/bucket_3", "pool/retired"} <= set(c.curves)
    check_comparison_dom(Dom(rep.html), lab.cmp, rendered=False)
    # a child run's id selects its parent
    assert build_report(lab.cmp.outcomes[0].run_id, tracking_uri=lab.uri).run_id == lab.cmp.parent_run_id

    # logged on the parent run
    assert rep.log() == "dashboards/comparison.html"
    client = mlflow.MlflowClient(lab.uri)
    arts = [a.path for a in client.list_artifacts(lab.cmp.parent_run_id, "dashboards")]
    assert arts == ["dashboards/comparison.html"]
    local = client.download_artifacts(lab.cmp.parent_run_id, "dashboards/comparison.html", str(lab.tmp))
    assert Path(local).read_text(encoding="utf-8") == rep.html


def test_sweep_report_from_parent_run_and_from_study(lab):
    study = optuna.load_study(study_name="dash-study", storage=lab.storage)
    rep = build_report(lab.sw.parent_run_id, tracking_uri=lab.uri)
    assert rep.kind == "sweep" and rep.data.source == "optuna"
    check_sweep_dom(Dom(rep.html), study, rendered=False)
    assert rep.data.study.best_params == lab.sw.best_params
    assert rep.log() == "dashboards/sweep.html"
    client = mlflow.MlflowClient(lab.uri)
    assert "dashboards/sweep.html" in [a.path for a in client.list_artifacts(lab.sw.parent_run_id, "dashboards")]

    # by study name + storage: same trials, linked to the same parent run
    rep2 = build_report(study="dash-study", storage=lab.storage, tracking_uri=lab.uri)
    assert rep2.run_id == lab.sw.parent_run_id
    check_sweep_dom(Dom(rep2.html), study, rendered=False)

    # storage unreadable: the trials are rebuilt from the MLflow child runs
    rep3 = build_sweep_report(lab.sw.parent_run_id, tracking_uri=lab.uri, storage=f"sqlite:///{lab.tmp}/gone.db")
    assert rep3.data.source == "mlflow" and not (lab.tmp / "gone.db").exists()
    a, b = rep3.data.study.get_trials(), study.get_trials()
    assert [(t.number, t.state, t.params) for t in a] == [(t.number, t.state, t.params) for t in b]
    assert [t.value for t in a] == pytest.approx([t.value for t in b], rel=1e-12)
    assert rep3.data.study.best_params == study.best_params


def test_sweep_report_with_fewer_than_two_complete_trials():
    from exgrpo.dashboard import sweep as sw

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dist = {"train.lr": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)}
    study = optuna.create_study(direction="maximize")
    study.add_trial(optuna.trial.create_trial(params={"train.lr": 1e-3}, distributions=dist, value=0.25))
    study.add_trial(optuna.trial.create_trial(params={"train.lr": 1e-2}, distributions=dist,
                                              state=optuna.trial.TrialState.FAIL, user_attrs={"error": "boom"}))
    html = sw.render(sw.SweepData(study, "one", None, "val/accuracy", "optuna"))
    dom = Dom(html)
    assert "need at least 2 complete trials; the study has 1" in dom.all_text()
    assert dom.cell(param="train.lr", col="best_param")[1] == "0.001"
    assert dom.cell(trial=1, col="state")[1] == "FAIL" and "boom" in dom.all_text()
    empty = optuna.create_study()
    assert "No complete trial yet" in sw.render(sw.SweepData(empty, "none", None, "val/accuracy", "optuna"))


def test_errors_are_phrased_for_the_user(lab, tmp_path, capsys):
    from exgrpo.cli import main

    with pytest.raises(DashboardError, match="not found"):
        build_report("0" * 32, tracking_uri=lab.uri)
    with pytest.raises(DashboardError, match="no MLflow store"):
        build_report("x", tracking_uri=f"sqlite:///{tmp_path}/none.db")
    assert not (tmp_path / "none.db").exists()
    assert main(["dashboard", "--study", "nope", "--storage", lab.storage, "--tracking-uri", lab.uri,
                 "--out", str(tmp_path / "x.html")]) == 2
    assert "no study 'nope'" in capsys.readouterr().err and not (tmp_path / "x.html").exists()


def test_reports_render_in_headless_chromium(chromium, lab, tmp_path):
    cmp_rep = build_report(lab.cmp.parent_run_id, tracking_uri=lab.uri)
    sw_rep = build_report(lab.sw.parent_run_id, tracking_uri=lab.uri)
    srv, url = start_server({"/comparison.html": cmp_rep.html, "/sweep.html": sw_rep.html})
    try:
        assert url.startswith("http://127.0.0.1:")
        check_comparison_dom(Dom(dump_dom(chromium, url + "comparison.html", tmp_path)), lab.cmp, rendered=True)
        study = optuna.load_study(study_name="dash-study", storage=lab.storage)
        check_sweep_dom(Dom(dump_dom(chromium, url + "sweep.html", tmp_path)), study, rendered=True)
    finally:
        srv.shutdown()
        srv.server_close()


def test_cli_writes_a_file(lab, tmp_path, capsys):
    from exgrpo.cli import main

    out = tmp_path / "cmp.html"
    argv = ["dashboard", "--experiment", "dash-cmp", "--tracking-uri", lab.uri, "--out", str(out), "--no-log"]
    assert main(argv) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    check_comparison_dom(Dom(out.read_text(encoding="utf-8")), lab.cmp, rendered=False)


def test_cli_serves_until_interrupted(chromium, lab, tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "exgrpo.cli", "dashboard", "--run-id", lab.sw.parent_run_id,
                             "--tracking-uri", lab.uri, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines, url = [], None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and url is None:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "serving http://" in line:
                url = line.split("serving ", 1)[1].split()[0]
        assert url and url.startswith("http://127.0.0.1:"), "".join(lines)
        assert any("logged dashboards/sweep.html on MLflow run" in x for x in lines)
        study = optuna.load_study(study_name="dash-study", storage=lab.storage)
        check_sweep_dom(Dom(dump_dom(chromium, url, tmp_path)), study, rendered=True)
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=30)
    assert rc == 0 and "stopped." in proc.stdout.read()


def test_bands_stay_inside_what_the_metric_can_take():
    """Two seeds give a Student-t band many times wider than [0, 1]: drawn clipped to the metric's
    possible range (pass rates to [0, 1], pool counts to >= 0); an unbounded metric keeps it whole."""
    from exgrpo.stats import band, metric_range

    series = [{1: 0.0, 2: 1.0}, {1: 1.0, 2: 1.0}]
    _, mean, lo, hi, n = band(series, "batch/solved")
    assert mean[0] == 0.5 and (lo[0], hi[0]) == (0.0, 1.0) and n[0] == 2
    _, _, lo, hi, _ = band(series, "actor/pg_loss")
    assert lo[0] < -5 and hi[0] > 6
    _, _, lo, _, _ = band([{1: 0.0}, {1: 3.0}], "pool/retired")
    assert lo[0] == 0.0
    assert metric_range("val/accuracy") == metric_range("eval/train/avg_at_1") == metric_range("eval/gsm8k/pass_at_4") == (0.0, 1.0)


def test_the_comparisons_own_figure_clips_its_bands_as_the_dashboard_does(tmp_path):
    """The figure a comparison writes (comparison.png, the CLI's and the flow's) draws the same clipped
    bands as the dashboard: an accuracy band never reaches below 0 or above 1."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.collections import PolyCollection

    import matplotlib.pyplot as plt

    from exgrpo.compare import RunOutcome
    from exgrpo.compare import figures

    runs = [RunOutcome(arm="grpo", seed=s, final=v, curve_steps=[0, 8], curve_values=[0.0, v])
            for s, v in enumerate([0.0, 0.05, 0.9])]
    drawn = []
    close = plt.close
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plt, "close", lambda fig=None: drawn.append(fig))
        figures.comparison_figure(runs, ["grpo"], "val/accuracy", tmp_path / "c.png")
    (fig,) = drawn
    ys = [y for poly in fig.axes[0].collections if isinstance(poly, PolyCollection)
          for path in poly.get_paths() for y in path.vertices[:, 1]]
    close(fig)
    assert ys and min(ys) >= 0.0 and max(ys) <= 1.0, (min(ys), max(ys))
