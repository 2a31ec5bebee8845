"""The shared fixtures of tests/conftest.py do what the tests that lean on them assume."""

import os


def test_exgrpo_cache_builds_the_tiny_lm_once_for_the_whole_run(exgrpo_cache, request, monkeypatch):
    """One directory for the pytest run (the same object wherever it is asked for), in which a
    second load of a warm start is a cache hit."""
    from exgrpo.policies.lm.tiny_lm import TinyLMConfig, load_tiny_lm

    assert exgrpo_cache.is_dir() and request.getfixturevalue("exgrpo_cache") is exgrpo_cache
    fixturedef = request._fixturemanager.getfixturedefs("exgrpo_cache", request.node)[-1]
    assert fixturedef.scope == "session"
    monkeypatch.setenv("EXGRPO_CACHE", str(exgrpo_cache))
    cfg = TinyLMConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64, sft_steps=2,
                       sft_batch_size=8, sft_warmup=1, eval_questions=8, eval_max_new_tokens=8)
    load_tiny_lm(cfg, progress=False)
    again = load_tiny_lm(cfg, progress=False)
    assert again.cache_hit and os.path.commonpath([again.path, exgrpo_cache]) == str(exgrpo_cache)


def test_exgrpo_cache_is_shared_by_the_runs_workers(exgrpo_cache, tmp_path_factory):
    """Under ``make test``'s two workers, the cache lies above each worker's own temp directory, so a
    warm start built by one worker is a hit for the other (not built once per worker)."""
    own = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        assert not exgrpo_cache.is_relative_to(own) and own.is_relative_to(exgrpo_cache.parent)
    else:
        assert exgrpo_cache.is_relative_to(own)


def test_prefect_runs_on_a_home_of_this_pytest_run():
    """Prefect's ephemeral API keeps its database under PREFECT_HOME: one of this run's own (a worker's),
    never the user's ~/.prefect that another pytest process might be writing."""
    home = os.environ["PREFECT_HOME"]
    assert not home.startswith(os.path.expanduser("~/.prefect")) and os.path.isdir(home)


def test_the_module_lists_of_conftest_name_modules_that_exist():
    """A renamed or split test module must not silently lose its ``e2e`` mark (it would join ``make
    test-fast``) or its place in the longest-first order."""
    from pathlib import Path

    from conftest import E2E_MODULES, LONGEST_FIRST

    here = {p.stem for p in Path(__file__).parent.glob("test_*.py")}
    assert set(E2E_MODULES) - here == set() and set(LONGEST_FIRST) - here == set()
    assert set(LONGEST_FIRST) <= set(E2E_MODULES) and len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)


def test_each_worker_records_into_an_mlflow_store_of_its_own():
    """A worker inherits the environment of the pytest process that started it; the session's store
    must be the worker's own, not that process's one shared by both workers (two processes creating
    a sqlite store's tables at once fail a run at its start)."""
    from conftest import OWN_STORE

    process = os.environ.get("PYTEST_XDIST_WORKER", "main")
    assert os.environ["MLFLOW_TRACKING_URI"] == os.environ[OWN_STORE]
    assert f"exgrpo-test-mlflow-{process}-" in os.environ["MLFLOW_TRACKING_URI"]


def test_the_store_and_prefect_home_a_pytest_run_made_are_gone_when_it_ends(tmp_path):
    """A worker's MLflow store holds every model and checkpoint its tests logged (over a GB after a
    whole run): a pytest run removes the store and the Prefect home it made, and nothing else."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_inner.py").write_text(
        "import os\n"
        "def test_records():\n"
        "    store = os.environ['MLFLOW_TRACKING_URI'].removeprefix('sqlite:///').removesuffix('/mlflow.db')\n"
        "    open(os.path.join(store, 'mlflow.db'), 'w').write('x')\n"
        f"    open({str(tmp_path / 'made.txt')!r}, 'w').write(store + '\\n' + os.environ['PREFECT_HOME'])\n")
    kept = tmp_path / "kept"
    kept.mkdir()
    env = {**os.environ, "PREFECT_HOME": str(kept)}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          str(tmp_path / "test_inner.py")], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    store, home = (tmp_path / "made.txt").read_text().splitlines()
    assert "exgrpo-test-mlflow-" in store and "exgrpo-test-prefect-" in home
    assert not os.path.exists(store) and not os.path.exists(home) and kept.is_dir()
