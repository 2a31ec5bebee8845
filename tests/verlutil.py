"""What the veRL backend's tests share: the tiny configs, and the CLI run piped, in a terminal, or
evaluated."""

import json
import os
import subprocess
import sys
import time



EXGRPO = "experiments/verl-tiny-exgrpo.yaml"
GRPO = "experiments/verl-tiny-grpo.yaml"
ONE_VAL_QUESTION = 1 / 64 + 1e-9
"""Slack between veRL's validation and exgrpo's evaluation of the same weights: both decode greedily
with the same engine, but veRL's agent loop batches the 64 requests its own way, and a near-tie
argmax can round the other way in another batch layout (they were equal in every run so far)."""


def _env(cache):
    return {**os.environ, "EXGRPO_CACHE": str(cache), "PYTHONUNBUFFERED": "1"}


def _train(config, out, cache, *extra, check=True, progress=False, timeout=900):
    """`exgrpo train` piped, in a session of its own; ``progress``: without ``--no-progress`` (what a
    log of a default run shows)."""
    quiet = [] if progress else ["--no-progress"]
    cmd = [sys.executable, "-m", "exgrpo.cli", "train", config, *quiet, "--output-dir", str(out), *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(cache), timeout=timeout, start_new_session=True)
    if check:
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res


def _train_in_a_terminal(config, out, cache, *extra, timeout=900, env=None):
    """The CLI as a person runs it: in a pseudo-terminal, with its progress display (``env``: variables
    on top of the tests'); -> what the terminal showed (the run must succeed)."""
    import pty
    import select

    master, child_side = pty.openpty()
    cmd = [sys.executable, "-m", "exgrpo.cli", "train", config, "--output-dir", str(out), *extra]
    proc = subprocess.Popen(cmd, stdin=child_side, stdout=child_side, stderr=child_side,
                            env={**_env(cache), "COLUMNS": "120", **(env or {})}, start_new_session=True)
    os.close(child_side)
    shown, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 1.0)[0]:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the terminal's other side is closed: the CLI has exited
                    break
                if not data:
                    break
                shown.append(data)
            elif proc.poll() is not None:
                break
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    text = b"".join(shown).decode(errors="replace")
    assert rc == 0, text[-3000:]
    return text


def _rows(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _cli_val_score(checkpoint, cache, *extra):
    """(avg@1, problems) of `exgrpo eval --checkpoint CHECKPOINT --benchmarks val`, read from its table."""
    cmd = [sys.executable, "-m", "exgrpo.cli", "eval", "--checkpoint", checkpoint, "--benchmarks", "val", *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(cache), timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    row = next(line for line in res.stdout.splitlines() if line.startswith("| val | avg_at_1 |"))
    return float(row.split("|")[3]), int(row.split("|")[4])

