"""A green ``make test-fast`` ends clean: a pytest-xdist worker whose teardown outlasts execnet's 5 s
(its MLflow store to remove, pytest's garbage collections at unconfigure on a busy machine) is not
interrupted mid-teardown (tests/conftest.py: ``pytest_sessionfinish``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

SLOW_TEARDOWN = '''
import gc
import time

from hypothesis import given, strategies as st


@given(st.integers())
def test_with_hypothesis(x):  # hypothesis puts its gc callback first in gc.callbacks
    assert x == x


def test_a_teardown_that_outlasts_execnets_grace():
    # every collection from now on takes 1.5 s: pytest's five at unconfigure take 7.5 s
    gc.callbacks.append(lambda phase, info: time.sleep(0.75))
'''


@pytest.mark.slow
def test_a_slow_worker_teardown_ends_without_a_keyboard_interrupt(tmp_path):
    (tmp_path / "test_slow_teardown.py").write_text(SLOW_TEARDOWN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
           "EXECNET_DEBUG": "2"}  # execnet's trace (stderr) shows whether it interrupted a worker
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "conftest", "-p", "no:cacheprovider",
                          "--rootdir", str(tmp_path), str(tmp_path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "2 passed" in run.stdout
    assert "KeyboardInterrupt" not in run.stdout + run.stderr and "Unraisable" not in run.stdout


ORPHAN = '''
import subprocess


def test_that_starts_a_process_and_leaves_it_behind():
    subprocess.run(["sh", "-c", "sleep 97.25 &"], check=True)  # the shell exits: its sleep is re-parented to init
'''

CLEAN = '''
import subprocess


def test_that_waits_for_what_it_starts():
    subprocess.run(["sleep", "0.1"], check=True)
'''


@pytest.mark.slow  # runs pytest on a module in a fresh interpreter
def test_a_module_that_leaves_a_process_behind_is_named_and_its_process_stopped(tmp_path):
    import psutil

    (tmp_path / "test_orphan.py").write_text(ORPHAN)
    (tmp_path / "test_clean.py").write_text(CLEAN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
           "EXGRPO_TEST_ORPHAN_GRACE": "1"}
    try:
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                              "--rootdir", str(tmp_path), str(tmp_path)],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    finally:
        left = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "97.25"]]
        for p in left:  # not left to the next test
            p.kill()
    assert run.returncode == 1, run.stdout[-3000:]
    assert "2 passed, 1 error" in run.stdout, run.stdout[-3000:]
    # the teardown's own line; pytest's short summary repeats it (untruncated where CI is set)
    errors = [line for line in run.stdout.splitlines() if line.startswith("test_orphan left 1 process(es) running")]
    assert len(errors) == 1 and "test_orphan left" in errors[0] and "sleep 97.25" in errors[0], run.stdout[-3000:]
    assert not left  # stopped by the check
