"""Bad input and failed writes end with one line naming the problem and the
fix, not a traceback; non-finite numbers are not configs."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from exgrpo import cli
from exgrpo.config import ConfigError, load_experiment

TOY = ["--set=task.max_operand=4", "--set=policy.hidden=16", "--set=train.batch_size=8",
       "--set=algorithm.group_size=4", "--max-steps=4", "--set=train.checkpoint_every=2", "--no-progress"]


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_malformed_set_is_one_line(capsys):
    assert cli.main(["train", "experiments/toy-exgrpo.yaml", "--set", "train.lr"]) == 2
    assert "expected KEY=VALUE" in _one_line_error(capsys)


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", ".inf"])
def test_lr_inf_and_nan_are_rejected(value):
    with pytest.raises(ConfigError, match="train.lr"):
        load_experiment("experiments/toy-exgrpo.yaml", {"train.lr": value})
    with pytest.raises(ConfigError, match="algorithm.clip_eps"):
        load_experiment("experiments/toy-exgrpo.yaml", {"algorithm.clip_eps": value})


def test_eval_on_a_file_that_is_not_a_checkpoint_is_one_line(tmp_path, capsys):
    bogus = tmp_path / "notes.pt"
    bogus.write_text("these are my notes, not a checkpoint\n")
    assert cli.main(["eval", "--checkpoint", str(bogus), "--benchmarks", "val"]) == 2
    line = _one_line_error(capsys)
    assert str(bogus) in line and "not a readable exgrpo checkpoint" in line
    plain = tmp_path / "plain.pt"
    torch.save({"weights": torch.ones(2)}, plain)  # a real torch file, but not ours
    assert cli.main(["eval", "--checkpoint", str(plain), "--benchmarks", "val"]) == 2
    assert "not an exgrpo checkpoint" in _one_line_error(capsys)


class _Payload:
    """Pickles to a call of os.system: loading it without weights_only would run a command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_eval_refuses_a_hostile_pickle(tmp_path, capsys):
    marker = tmp_path / "pwned"
    evil = tmp_path / "step_0000001.pt"
    torch.save({"config": "{}", "model": _Payload(marker)}, evil)
    assert cli.main(["eval", "--checkpoint", str(evil), "--benchmarks", "val"]) == 2
    assert "refused to load" in _one_line_error(capsys)
    assert not marker.exists(), "the pickle's payload ran"


def _run_cli(args: list[str], preexec=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exgrpo.cli", *args], capture_output=True, text=True,
                          preexec_fn=preexec, timeout=300)


def test_read_only_run_dir_is_one_line(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    # root ignores permission bits; the immutable attribute binds root too (else: a sysfs path)
    immutable = subprocess.run(["chattr", "+i", str(ro)], capture_output=True).returncode == 0
    target = ro if immutable else Path("/sys/exgrpo-read-only-test")
    try:
        out = _run_cli(["train", "experiments/toy-exgrpo.yaml", "--output-dir", str(target), "--no-tracking", *TOY])
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(ro)], check=True)
    err = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(err) == 1 and err[0].startswith(f"error: cannot write {target}") and "writable --output-dir" in err[0], err


@pytest.mark.slow  # trains in a fresh interpreter on a full disk
def test_full_disk_is_one_line_and_leaves_no_tmp(tmp_path):
    """A write that fails for space (here: a file-size limit, EFBIG, standing in for ENOSPC) ends the
    run with one line; the checkpoint's temp file is removed."""

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of the process dying
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    out = _run_cli(["train", "experiments/toy-exgrpo.yaml", "--output-dir", str(tmp_path), "--no-tracking", *TOY],
                   preexec=small_files)  # the run directory's writes (MLflow's store is elsewhere)
    err = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(err) == 1 and "error: cannot write" in err[0] and "--output-dir" in err[0], err
    assert not list(tmp_path.rglob("*.tmp"))
