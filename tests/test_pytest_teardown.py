"""A green ``make test-fast`` ends clean: a pytest-xdist worker whose teardown outlasts execnet's 5 s
(its MLflow store to remove, pytest's garbage collections at unconfigure on a busy machine) is not
interrupted mid-teardown (tests/conftest.py: ``pytest_sessionfinish``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
