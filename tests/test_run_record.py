"""One (config, seed) run is one MLflow run: a killed run is ended KILLED (by the next command that
touches it, or `exgrpo sync`) and its `--resume` continues the same MLflow run; a `--resume` with no
checkpoint says so. The kill is real: SIGKILL of an `exgrpo train` process."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

mlflow = pytest.importorskip("mlflow")

from exgrpo.config import load_experiment  # noqa: E402
from exgrpo.tracking import Tracker  # noqa: E402
from exgrpo.tracking.run_record import RECORD_FILE, end_if_orphaned, read_record, write_record  # noqa: E402

SMALL = {"task.max_operand": 5, "policy.hidden": 16, "policy.layers": 1, "algorithm.group_size": 4,
         "train.batch_size": 8, "train.checkpoint_every": 2, "train.keep_last": 2, "train.eval_every_steps": 1000}


def _cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exgrpo.cli", *args], capture_output=True, text=True, timeout=300, **kw)


def _dead_pid_record(where, uri: str, run_id: str) -> None:
    """A record as a process that has since ended left it."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    write_record(where, uri, run_id)
    record = json.loads((where / RECORD_FILE).read_text())
    (where / RECORD_FILE).write_text(json.dumps({**record, "pid": proc.pid}))


def test_a_run_whose_process_is_gone_is_ended_killed_and_only_then(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = Tracker(uri)
    runs = {name: tracker.start_run("rec", name) for name in ("gone", "alive", "pending", "elsewhere", "ended")}
    for name, run_id in runs.items():
        (tmp_path / name).mkdir()
        if name == "alive":
            write_record(tmp_path / name, uri, run_id)  # this process: alive
        else:
            _dead_pid_record(tmp_path / name, uri, run_id)
    (tmp_path / "gone" / "metrics.jsonl").write_text('{"step": 1.0}\n')
    os.utime(tmp_path / "gone" / "metrics.jsonl", (1_700_000_000, 1_700_000_000))
    (tmp_path / "pending" / "mlflow_pending.json").write_text("{}")  # waits for `exgrpo sync` to deliver it
    record = json.loads((tmp_path / "elsewhere" / RECORD_FILE).read_text())
    (tmp_path / "elsewhere" / RECORD_FILE).write_text(json.dumps({**record, "host": socket.gethostname() + "-other"}))
    tracker.end_run(runs["ended"], "FINISHED")

    lines = {name: end_if_orphaned(tmp_path / name) for name in runs}
    status = {name: tracker.client.get_run(run_id).info.status for name, run_id in runs.items()}
    assert status == {"gone": "KILLED", "alive": "RUNNING", "pending": "RUNNING", "elsewhere": "RUNNING",
                      "ended": "FINISHED"}
    assert lines["gone"].startswith(f"MLflow run {runs['gone']} (gone) was left RUNNING") and "marked KILLED" in lines["gone"]
    assert [name for name, line in lines.items() if line] == ["gone"]
    killed = tracker.client.get_run(runs["gone"])
    assert killed.info.end_time == 1_700_000_000_000 and "ended without ending it" in killed.data.tags["killed"]
    assert end_if_orphaned(tmp_path / "gone") is None  # once


def test_resume_without_a_checkpoint_says_so_and_trains_from_step_one(tmp_path, capsys):
    from exgrpo import cli

    cfg = load_experiment("experiments/toy-grpo.yaml", {**SMALL, "output_dir": str(tmp_path), "train.max_steps": 2})
    cfg.run_dir().mkdir(parents=True)
    (cfg.run_dir() / "metrics.jsonl").write_text('{"step": 1.0}\n')  # killed before its first checkpoint
    args = ["train", "experiments/toy-grpo.yaml", "--resume", "--no-progress", "--no-tracking", "--output-dir",
            str(tmp_path), *[f"--set={k}={v}" for k, v in {**SMALL, "train.max_steps": 2}.items()]]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    notes = [ln for ln in out.splitlines() if ln.startswith("note: --resume")]
    assert notes == [f"note: --resume: {cfg.run_dir() / 'checkpoints'} holds no checkpoint (it checkpoints every 2 "
                     "steps); training from step 1"]
    assert "held an earlier run; moved it to" in out and "(it had no checkpoint to resume from)" in out
    assert [json.loads(ln)["step"] for ln in (cfg.run_dir() / "metrics.jsonl").read_text().splitlines()] == [1.0, 2.0]


def test_a_killed_train_is_ended_killed_by_sync_and_its_resume_continues_the_same_mlflow_run(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    sets = [f"--set={k}={v}" for k, v in SMALL.items()]
    base = ["train", "experiments/toy-grpo.yaml", "--no-progress", "--output-dir", str(tmp_path / "runs"),
            "--tracking-uri", uri, *sets]
    proc = subprocess.Popen([sys.executable, "-m", "exgrpo.cli", *base, "--max-steps", "1000000"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run_dir = tmp_path / "runs" / "toy-grpo" / "seed0"
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            ckpts = list((run_dir / "checkpoints").glob("step_*.pt")) if (run_dir / "checkpoints").is_dir() else []
            if len(ckpts) >= 2 and (run_dir / RECORD_FILE).is_file():
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before it could be killed"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    record = read_record(run_dir)
    client = mlflow.MlflowClient(uri)
    assert client.get_run(record.run_id).info.status == "RUNNING"  # what a kill leaves

    out = _cli("sync", str(tmp_path / "runs"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"MLflow run {record.run_id} (grpo-seed0) was left RUNNING" in out.stdout and "marked KILLED" in out.stdout
    assert client.get_run(record.run_id).info.status == "KILLED"

    done = json.loads(run_dir.joinpath("metrics.jsonl").read_text().splitlines()[-1])["step"]
    out = _cli(*base, "--resume", "--max-steps", str(int(done) + 3))
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout[out.stdout.index("{"):])["mlflow_run_id"] == record.run_id
    (exp,) = [e for e in client.search_experiments() if e.name == "toy-grpo"]
    runs = client.search_runs([exp.experiment_id])
    assert [(r.info.run_id, r.info.run_name, r.info.status) for r in runs] == [(record.run_id, "grpo-seed0", "FINISHED")]
    steps = sorted({m.step for m in client.get_metric_history(record.run_id, "batch/solved")})
    assert steps == list(range(1, int(done) + 4))
    assert "killed" not in runs[0].data.tags and runs[0].data.tags["resumed_with"] == f"train.max_steps={int(done) + 3}"


def test_a_refused_resume_opens_no_mlflow_run_and_keeps_the_runs_record(tmp_path, capsys):
    """A --resume the backend would refuse (another config, or training past a finished run's slim last
    checkpoint) is refused before the MLflow record opens: no FAILED run, and the run directory still names
    its finished run."""
    from exgrpo import cli

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    sets = {**SMALL, "train.final_checkpoint_optimizer": False}
    base = ["train", "experiments/toy-grpo.yaml", "--no-progress", "--output-dir", str(tmp_path / "runs"),
            "--tracking-uri", uri, *[f"--set={k}={v}" for k, v in sets.items()]]
    assert cli.main([*base, "--max-steps", "4"]) == 0
    run_dir = tmp_path / "runs" / "toy-grpo" / "seed0"
    finished = read_record(run_dir).run_id
    capsys.readouterr()
    refusals = {"--max-steps 8": ["--max-steps", "8"], "another lr": ["--max-steps", "4", "--set=train.lr=0.01"]}
    for why, extra in refusals.items():
        assert cli.main([*base, "--resume", *extra]) == 2, why
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith("error: --resume: "), (why, err)
        client = mlflow.MlflowClient(uri)
        (exp,) = [e for e in client.search_experiments() if e.name == "toy-grpo"]
        runs = client.search_runs([exp.experiment_id])
        assert [(r.info.run_id, r.info.status) for r in runs] == [(finished, "FINISHED")], why
        assert read_record(run_dir).run_id == finished, why
    assert cli.main([*base, "--resume", "--max-steps", "4"]) == 0  # the finished run still reads back, as itself
    assert [r.info.run_id for r in mlflow.MlflowClient(uri).search_runs([exp.experiment_id])] == [finished]


def test_a_finished_run_recorded_before_a_field_existed_is_reused_while_the_field_holds_its_default(tmp_path):
    """A comparison resumed on a newer version reuses its finished runs: a param their record lacks (a field
    added since) counts as equal while the field holds its default, the behaviour before the field."""
    from exgrpo.config.fields import at_default
    from exgrpo.tracking.run_record import continuable

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = Tracker(uri)
    run_id = tracker.start_run("rec", "old")
    tracker.client.log_param(run_id, "train.lr", "0.001")
    tracker.end_run(run_id, "FINISHED")
    write_record(tmp_path, uri, run_id)
    now = {"train.lr": "0.001", "train.mini_batch_split": "None"}
    assert continuable(tmp_path, tracker.client, uri, now) is None
    assert continuable(tmp_path, tracker.client, uri, now, at_default={"train.mini_batch_split"}) == run_id
    assert continuable(tmp_path, tracker.client, uri, {**now, "train.lr": "0.01"}, at_default=set(now)) is None

    cfg = load_experiment("experiments/toy-grpo.yaml")
    assert at_default(cfg, "train.mini_batch_split") and at_default(cfg, "train.final_checkpoint_optimizer")
    assert not at_default(load_experiment("experiments/toy-grpo.yaml", {"train.mini_batch_split": "groups"}),
                          "train.mini_batch_split")
    assert not at_default(cfg, "train.no_such_field") and not at_default(cfg, "task.no.such")
