"""``exgrpo ui`` after ``exgrpo compare``, as a user meets them: a project with no PREFECT_HOME,
PREFECT_API_URL or MLFLOW_TRACKING_URI set, a comparison run from the command line, then ``exgrpo ui``
in the same project; its Prefect and MLflow pages are read in headless Chromium (tests/browser.py)."""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

requests = pytest.importorskip("requests")
pytest.importorskip("prefect")
pytest.importorskip("mlflow")

from browser import Browser, app_dom, find_chromium  # noqa: E402
from netutil import free_port  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
COMPARE = (
    "base:\n  name: ui-cmp\n  task: {max_operand: 5}\n  policy: {hidden: 16, layers: 1}\n"
    "  algorithm: {group_size: 4, replay_start_pass_rate: 0.0}\n  train: {batch_size: 8, max_steps: 4, lr: 0.01}\n"
    "arms:\n  grpo: {algorithm.replay: none}\n  exgrpo: {algorithm.replay: buckets}\nbaseline: grpo\nseeds: [0]\n"
)


def _user_env(project: Path, mlflow_ui: str) -> dict[str, str]:
    """A shell in ``project`` with no Prefect setting and no MLflow store set (what a new user has; other test
    modules set Prefect variables in this process at collection)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "MLFLOW_TRACKING_URI"}
    env.update(EXGRPO_MLFLOW_UI=mlflow_ui, PYTHONPATH=str(REPO),
               RAY_TMPDIR=tempfile.mkdtemp(prefix="ray", dir="/tmp"),  # Ray's socket paths must stay short
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="600")  # a busy shared machine: a bound, not a limit
    return env


def _start_ui(project: Path, env: dict[str, str], ports: SimpleNamespace) -> tuple[subprocess.Popen, str, queue.Queue]:
    """`exgrpo ui` in ``project``, once it says it is ready (or within 180 s); -> (its process, what it said,
    the lines it says from then on: "" at its end)."""
    proc = subprocess.Popen([sys.executable, "-m", "exgrpo.cli", "ui", "--prefect-port", str(ports.prefect),
                             "--mlflow-port", str(ports.mlflow), "--optuna-port", str(ports.optuna)],
                            cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    said: queue.Queue[str] = queue.Queue()  # read on a thread: a silent `exgrpo ui` cannot block past the deadline
    threading.Thread(target=lambda: [said.put(x) for x in iter(proc.stdout.readline, "")] + [said.put("")],
                     daemon=True).start()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            line = said.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        if not line:
            break
        lines.append(line)
        if "Ctrl-C stops all" in line:
            break
    return proc, "".join(lines), said


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    """A project (its own pyproject.toml) where `exgrpo compare` ran (2 arms x 1 seed), then `exgrpo ui`."""
    project = tmp_path_factory.mktemp("project")
    shutil.copy(REPO / "pyproject.toml", project / "pyproject.toml")
    (project / "cmp.yaml").write_text(COMPARE)
    ports = SimpleNamespace(prefect=free_port(), mlflow=free_port(), optuna=free_port())
    mlflow_ui = f"http://127.0.0.1:{ports.mlflow}"
    env = _user_env(project, mlflow_ui)
    cmp = subprocess.run([sys.executable, "-m", "exgrpo.cli", "compare", "cmp.yaml", "--no-progress"],
                         cwd=project, env=env, capture_output=True, text=True, timeout=600)
    assert cmp.returncode == 0, cmp.stderr[-3000:]
    proc, out, _ = _start_ui(project, env, ports)
    state = SimpleNamespace(project=project, ports=ports, compare=cmp.stdout + cmp.stderr, out=out,
                            proc=proc, prefect=f"http://127.0.0.1:{ports.prefect}", mlflow=mlflow_ui)
    try:
        yield state
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)


@pytest.fixture(scope="module")
def chromium() -> str:
    return find_chromium()


def test_ui_starts_three_servers(ui):
    assert "Ctrl-C stops all" in ui.out, ui.out
    for port in vars(ui.ports).values():
        assert f"http://127.0.0.1:{port}" in ui.out
    assert requests.get(f"{ui.prefect}/api/health", timeout=5).json() is True
    assert requests.get(f"{ui.mlflow}/health", timeout=5).text == "OK"
    assert "study_summaries" in requests.get(f"http://127.0.0.1:{ui.ports.optuna}/api/studies", timeout=5).json()
    # the stores reach MLflow and optuna-dashboard through their environment: no URI on a command line, which
    # every user of the host can read (a URI with a password would show it)
    import psutil

    lines = [" ".join(p.cmdline()) for p in psutil.Process(ui.proc.pid).children(recursive=True)]
    assert len(lines) >= 3 and not [x for x in lines if "sqlite:" in x or "postgresql" in x], lines


def test_the_comparison_and_the_ui_share_the_projects_prefect_home(ui):
    home = ui.project / ".prefect"
    assert (home / "prefect.db").is_file(), "the comparison's flow run went elsewhere (~/.prefect?)"
    assert f"Prefect home: {home}" in ui.out
    # while `exgrpo ui` runs, the commands find its server
    record = (home / "exgrpo-ui.json").read_text()
    assert f"{ui.prefect}/api" in record


def test_the_prefect_ui_shows_the_comparisons_flow_run_task_runs_and_artifacts(ui, chromium, tmp_path):
    (run,) = requests.post(f"{ui.prefect}/api/flow_runs/filter", json={}, timeout=10).json()  # the comparison's, alone
    name = run["name"]
    assert run["state_type"] == "COMPLETED" and run["flow_id"]
    listing = app_dom(chromium, f"{ui.prefect}/runs", tmp_path, expect=name)
    assert name in listing and "Can't connect to Server API" not in listing
    page = app_dom(chromium, f"{ui.prefect}/runs/flow-run/{run['id']}?tab=Task%20Runs", tmp_path,
                   expect="exgrpo seed 0")
    assert "grpo seed 0" in page and "exgrpo seed 0" in page  # one task run per (arm, seed), in their own tab
    artifacts = app_dom(chromium, f"{ui.prefect}/artifacts", tmp_path, expect="ui-cmp-comparison")
    assert "ui-cmp-comparison" in artifacts and "ui-cmp-progress" in artifacts


def _printed_link(ui) -> str:
    (url,) = re.findall(r"MLflow parent run: (\S+)", ui.compare)
    return url


def test_mlflow_links_open_on_the_training_runs_and_the_clicks_after_stay_there(ui, chromium, tmp_path):
    """A fresh browser profile opens the printed link, clicks a child run in the parent's "Child runs",
    then the experiment in the breadcrumb: each page is MLflow's "Model training" view (a plain
    ``?workflowType=machine_learning`` link holds for its first page only; the next click was GenAI's
    empty traces overview)."""
    link = _printed_link(ui)
    assert link.startswith(f"{ui.mlflow}/exgrpo/open#/experiments/") and link.endswith("?workflowType=machine_learning")
    experiments = re.search(r"mlflow\s+(\S+)", ui.out).group(1)
    assert experiments == f"{ui.mlflow}/exgrpo/open#/experiments?workflowType=machine_learning"
    experiment_id = link.split("#/experiments/")[1].split("/")[0]
    browser = Browser(chromium, tmp_path)
    try:
        browser.open(link)
        browser.wait_text("Child runs")
        browser.click("//a[normalize-space()='grpo-seed0']")  # in the parent's "Child runs"
        child = browser.wait_text("Parent run")
        assert "grpo-seed0" in child and "Model metrics" in child
        assert "Observability" not in child and "Evaluations" not in child, child[:800]  # GenAI's sidebar, tabs
        browser.click(f"//a[@href='#/experiments/{experiment_id}']")  # the experiment, in the breadcrumb
        runs = browser.wait_text("Run Name", "Detect Issues")  # the runs table, or GenAI's traces overview
        if "Detect Issues" not in runs:
            runs = browser.wait_text("compare-ui-cmp")  # the table's rows load after its header
        assert "compare-ui-cmp" in runs and "/overview" not in browser.url
        assert "Detect Issues" not in runs and "Observability" not in runs, runs[:800]
    finally:
        browser.close()


def test_the_parent_runs_description_is_a_table_mlflow_shows_whole(ui, chromium, tmp_path):
    page = app_dom(chromium, _printed_link(ui), tmp_path, expect="diff vs grpo")
    assert "compare-ui-cmp" in page and "Evaluations" not in page  # the run page of the training-runs view
    tables = re.findall(r"<table.*?</table>", page, flags=re.S)
    described = [t for t in tables if "diff vs grpo" in t]
    assert len(described) == 1, tables
    heads = [re.sub(r"<[^>]+>", "", h).strip() for h in re.findall(r"<th.*?</th>", described[0], flags=re.S)]
    assert heads == ["arm", "seeds", "final val/accuracy (mean ± 95% CI)", "diff vs grpo [95% CI]"]


def test_ui_stops_its_servers_and_withdraws_its_server_record(ui):
    import psutil

    children = psutil.Process(ui.proc.pid).children(recursive=True)
    assert len(children) >= 3
    ui.proc.send_signal(signal.SIGINT)
    ui.proc.wait(timeout=60)
    time.sleep(1)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert not (ui.project / ".prefect" / "exgrpo-ui.json").exists()


@pytest.mark.parametrize("first, second", [(signal.SIGTERM, None), (signal.SIGINT, signal.SIGINT)],
                         ids=["sigterm", "ctrl-c-twice"])
def test_ui_stopped_by_a_signal_stops_every_service_even_when_a_second_one_comes_while_it_stops(tmp_path, first, second):
    """Ctrl-C is its own way to end (0); SIGTERM ends it as every command (143). A second signal while
    it stops kills what is left at once instead of interrupting the stop: the services, in sessions of
    their own, ran on."""
    import psutil

    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(REPO / "pyproject.toml", project / "pyproject.toml")
    ports = SimpleNamespace(prefect=free_port(), mlflow=free_port(), optuna=free_port())
    proc, out, said = _start_ui(project, _user_env(project, f"http://127.0.0.1:{ports.mlflow}"), ports)
    try:
        assert "Ctrl-C stops all" in out, out
        services = psutil.Process(proc.pid).children(recursive=True)
        assert len(services) >= 3
        proc.send_signal(first)
        if second is not None:
            while "stopping" not in (line := said.get(timeout=60)):  # a hang guard
                assert line, "it ended before it said it stops"
            proc.send_signal(second)
        proc.wait(timeout=60)  # a hang guard
        _, alive = psutil.wait_procs(services, timeout=30)
    finally:
        proc.kill()
        proc.wait()
    for p in alive:  # not left to the next test
        p.kill()
    assert not alive, [" ".join(p.cmdline()) for p in alive if p.is_running()]
    assert proc.returncode == (143 if first == signal.SIGTERM else 0)
