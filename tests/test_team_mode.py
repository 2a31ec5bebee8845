"""Team mode: MLflow's backend store and Optuna's storage on a real PostgreSQL (no mocks).

    scripts/setup-postgres.sh            # 127.0.0.1:55432, user exgrpo, databases mlflow + optuna

The stores are configured the way a team member would: ``MLFLOW_TRACKING_URI`` and
``EXGRPO_OPTUNA_STORAGE`` in the environment (URLs overridable with ``EXGRPO_PG_MLFLOW_URL`` /
``EXGRPO_PG_OPTUNA_URL``). Without a reachable server the tests skip, unless
``EXGRPO_REQUIRE_POSTGRES`` is set (CI), where they fail.
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import tempfile
import uuid

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PG_MLFLOW = os.environ.get("EXGRPO_PG_MLFLOW_URL", "postgresql://exgrpo:exgrpo@127.0.0.1:55432/mlflow")
PG_OPTUNA = os.environ.get("EXGRPO_PG_OPTUNA_URL", "postgresql://exgrpo:exgrpo@127.0.0.1:55432/optuna")
REQUIRED = bool(os.environ.get("EXGRPO_REQUIRE_POSTGRES"))


def _engine(url: str):
    """A plain SQLAlchemy engine on ``url`` (the driver SQLAlchemy picks for postgresql://, as MLflow
    and Optuna do: psycopg2 on SQLAlchemy 2.0)."""
    import sqlalchemy

    return sqlalchemy.create_engine(url, connect_args={"connect_timeout": 3}, poolclass=sqlalchemy.pool.NullPool)


def _why_unavailable() -> str | None:
    for url in (PG_MLFLOW, PG_OPTUNA):
        try:
            with _engine(url).connect():
                pass
        except ImportError as e:
            return f"no PostgreSQL driver for SQLAlchemy ({e}; pip install psycopg2-binary)"
        except Exception as e:  # noqa: BLE001 - any failure means "not reachable" here
            msg = str(getattr(e, "orig", None) or e).strip()
            first = msg.splitlines()[0] if msg else ""
            return f"PostgreSQL is not reachable at {url.split('@')[-1]} ({type(e).__name__}: {first})"
    return None


_why = _why_unavailable()
if _why is not None and not REQUIRED:
    pytest.skip(f"{_why}; run scripts/setup-postgres.sh (as root on Debian it installs PostgreSQL); "
                f"set EXGRPO_REQUIRE_POSTGRES=1 to make this a failure", allow_module_level=True)


@pytest.fixture(autouse=True)
def _require_postgres():
    """CI (EXGRPO_REQUIRE_POSTGRES set): every test of this module fails without the server."""
    if _why is not None:
        pytest.fail(f"EXGRPO_REQUIRE_POSTGRES is set but {_why} (run scripts/setup-postgres.sh first)",
                    pytrace=False)

optuna = pytest.importorskip("optuna")
mlflow = pytest.importorskip("mlflow")
pytest.importorskip("ray")
yaml = pytest.importorskip("yaml")

if "RAY_TMPDIR" not in os.environ:  # short: Ray's unix socket paths are length-limited
    os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    atexit.register(shutil.rmtree, os.environ["RAY_TMPDIR"], True)

from optuna.trial import TrialState  # noqa: E402

from exgrpo.config import load_compare  # noqa: E402
from exgrpo.errors import redact_uri  # noqa: E402
from exgrpo.sweep import load_sweep, run_sweep  # noqa: E402
from exgrpo.compare.tracked import run_tracked_compare  # noqa: E402

TINY_BASE = {
    "base.task.max_operand": 5, "base.train.batch_size": 16, "base.algorithm.group_size": 4,
    "base.policy.hidden": 32, "base.policy.layers": 2, "budget_steps": 8,
}


@pytest.fixture
def team_env(monkeypatch, tmp_path):
    """The environment a team member exports (URLs from scripts/setup-postgres.sh)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", PG_MLFLOW)
    monkeypatch.setenv("EXGRPO_OPTUNA_STORAGE", PG_OPTUNA)
    monkeypatch.setenv("EXGRPO_ARTIFACT_ROOT", str(tmp_path / "artifacts"))
    return uuid.uuid4().hex[:10]  # names unique per test run: the databases outlive the test


def _sql(url: str, query: str, **params):
    import sqlalchemy

    with _engine(url).connect() as conn:
        return [tuple(r) for r in conn.execute(sqlalchemy.text(query), params)]


def _overlap(runs) -> bool:
    spans = sorted((r.info.start_time, r.info.end_time) for r in runs)
    return any(b[0] < a[1] for a, b in itertools.pairwise(spans))


def test_sweep_on_two_ray_workers_lands_in_postgres(team_env, tmp_path):
    tag = team_env
    study_name, experiment = f"team-{tag}", f"team-sweep-{tag}"
    sc = load_sweep({
        "study": {"name": study_name, "n_trials": 4, "parallel": 2, "pruner": "none", "n_startup_trials": 10},
        "base": "experiments/toy.yaml",
        "base_overrides": {"name": experiment, "algorithm.replay": "buckets", "output_dir": str(tmp_path / "runs")},
        "budget_steps": 8,
        "space": {"algorithm.experience_ratio": {"type": "float", "low": 0.1, "high": 0.9},
                  "algorithm.shaping": {"type": "categorical", "choices": ["policy_shaping", "identity"]}},
    }, TINY_BASE)
    res = run_sweep(sc)  # storage and tracking URI from the environment

    assert res.storage == PG_OPTUNA and res.tracking_uri == PG_MLFLOW
    assert len(res.outcomes) == 4 and all(o["state"] == "COMPLETE" for o in res.outcomes), res.table()
    assert res.counts == {"COMPLETE": 4, "PRUNED": 0, "FAIL": 0}

    # Optuna: the study, its trials and their intermediate values are in PostgreSQL
    study = optuna.load_study(study_name=study_name, storage=PG_OPTUNA)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 4
    assert study.trials[0].params == {"algorithm.experience_ratio": 0.5, "algorithm.shaping": "policy_shaping"}
    assert all(list(t.intermediate_values) == [4, 8] for t in study.trials)
    assert study.user_attrs["mlflow_parent_run_id"] == res.parent_run_id
    rows = _sql(PG_OPTUNA, "SELECT t.state, count(*) FROM trials t JOIN studies s USING (study_id) "
                           "WHERE s.study_name = :name GROUP BY t.state", name=study_name)
    assert rows == [("COMPLETE", 4)]

    # MLflow: one parent run, four child runs (two at a time), metrics and checkpoints
    client = mlflow.MlflowClient(PG_MLFLOW)
    exp = client.get_experiment_by_name(experiment)
    assert exp.artifact_location.startswith((tmp_path / "artifacts").as_uri())
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == res.parent_run_id]
    assert parent.info.run_id == res.parent_run_id and parent.info.status == "FINISHED"
    assert parent.data.metrics["trials_complete"] == 4
    assert parent.data.params["optuna.storage"] == redact_uri(PG_OPTUNA)  # readable by anyone who reaches MLflow
    assert len(runs) == 5 and len(children) == 4
    assert {r.info.status for r in children} == {"FINISHED"}
    assert {r.data.tags["study"] for r in children} == {study_name}
    assert {t.user_attrs["mlflow_run_id"] for t in study.trials} == {r.info.run_id for r in children}
    assert _overlap(children), "two Ray workers: trials should run concurrently"
    for r in children:
        assert len(client.get_metric_history(r.info.run_id, "val/accuracy")) == 2
        assert [a.path for a in client.list_artifacts(r.info.run_id, "checkpoints")]
    (n_runs,) = _sql(PG_MLFLOW, "SELECT count(*) FROM runs WHERE experiment_id = :e", e=int(exp.experiment_id))[0]
    assert n_runs == 5


def test_compare_2_arms_x_2_seeds_lands_in_postgres(team_env, tmp_path):
    tag = team_env
    name = f"team-cmp-{tag}"
    cfg = tmp_path / "cmp.yaml"
    cfg.write_text(yaml.safe_dump({
        "base": {"name": name, "output_dir": str(tmp_path / "runs"),
                 "task": {"max_operand": 5}, "policy": {"hidden": 32, "layers": 2},
                 "algorithm": {"group_size": 4, "replay_start_pass_rate": 0.0},
                 "train": {"batch_size": 16, "max_steps": 8}},
        "arms": {"grpo": {"algorithm.replay": "none"}, "exgrpo": {"algorithm.replay": "buckets"}},
        "baseline": "grpo", "seeds": [0, 1],
    }))
    res = run_tracked_compare(load_compare(cfg), executor="ray", workers=2)  # tracking URI from the environment
    assert res.tracking_uri == PG_MLFLOW and not res.failures
    assert "| exgrpo | 2 |" in res.table and "| grpo | 2 |" in res.table

    client = mlflow.MlflowClient(PG_MLFLOW)
    exp = client.get_experiment_by_name(name)
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("kind") == "compare"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert parent.info.run_id == res.parent_run_id and parent.info.status == "FINISHED"
    assert len(runs) == 5 and len(children) == 4
    assert sorted((r.data.tags["algo"], r.data.tags["seed"]) for r in children) == [
        ("exgrpo", "0"), ("exgrpo", "1"), ("grpo", "0"), ("grpo", "1")]
    assert {r.info.status for r in children} == {"FINISHED"}
    assert _overlap(children), "two Ray workers: runs should overlap in time"
    for arm in ("grpo", "exgrpo"):
        assert f"{arm}/final_mean" in parent.data.metrics
    assert "exgrpo/diff_vs_grpo" in parent.data.metrics
    assert "comparison.md" in {a.path for a in client.list_artifacts(parent.info.run_id)}
    for o in res.outcomes:  # each outcome's final value is the child's logged metric
        child = client.get_run(o.run_id)
        assert child.data.metrics["val/accuracy"] == pytest.approx(o.final)
    # straight from PostgreSQL: 4 children, each with its per-step metric history
    rows = _sql(PG_MLFLOW, "SELECT r.run_uuid, count(m.step) FROM runs r "
                           "JOIN tags t ON t.run_uuid = r.run_uuid AND t.key = 'mlflow.parentRunId' "
                           "LEFT JOIN metrics m ON m.run_uuid = r.run_uuid AND m.key = 'batch/solved' "
                           "WHERE t.value = :parent GROUP BY r.run_uuid", parent=parent.info.run_id)
    assert len(rows) == 4 and all(n == 8 for _, n in rows), rows
