"""Resident memory of a native run, phase by phase: the peak of each phase of a step and what stays after it.

    .venv/bin/python bench/memory_phases.py experiments/smollm2-secret-fp32.yaml [--steps 3] [--set key=value ...]

Builds the config's trainer (its first arm for a comparison file), evaluates once, trains ``--steps``
steps and evaluates again, as a run does. Before each phase of a step (the trainer's own
``time/<phase>_seconds`` phases: replay, rollout, old_log_prob, reward, forward, backward; a phase that
runs several times in a step, as forward and backward do per mini-batch, shows its highest peak) the
process's peak is reset (``/proc/self/clear_refs``), so the peak read after the phase is that phase's
own. After each phase the heap is trimmed (``release_freed_memory``: glibc's ``malloc_trim``), so
``after`` is what the phase left alive, not what glibc kept (with ``train.keep_freed_memory`` on, glibc
keeps every freed page, and the RSS of a run stays at the highest of these peaks plus its
fragmentation: run with ``--set train.keep_freed_memory=false`` to read each
phase apart). Linux only; the numbers are MiB of resident memory.
"""

from __future__ import annotations

import argparse
import contextlib
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from exgrpo.backends.native import trainer as native  # noqa: E402
from exgrpo.backends.native.memory import release_freed_memory  # noqa: E402
from exgrpo.config.experiment import parse_set  # noqa: E402
from exgrpo.config.run import load_run  # noqa: E402



def resident() -> tuple[int, int]:
    """(current, peak since the last reset) resident memory of this process, MiB."""
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return int(fields["VmRSS"].split()[0]) // 1024, int(fields["VmHWM"].split()[0]) // 1024


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    cfg, _ = load_run(args.config, parse_set(args.sets))
    phases: dict[str, tuple[int, int]] = {}
    timed = native.Trainer._timed
    depth = [0]  # a phase inside another (the replay's re-scoring) is the outer phase's part

    @contextlib.contextmanager
    def measured(self, phase: str):
        depth[0] += 1
        outer = depth[0] == 1
        if outer:
            reset_peak()
        try:
            with timed(self, phase):
                yield
        finally:
            depth[0] -= 1
        if outer:  # the highest peak of the phase's blocks in the step (forward and backward: per mini-batch)
            peak = resident()[1]
            release_freed_memory()
            phases[phase] = (max(peak, phases.get(phase, (0, 0))[0]), resident()[0])

    native.Trainer._timed = measured
    trainer = native.Trainer(cfg)
    print(f"{cfg.name}: built, {resident()[0]} MiB")

    def evaluation(label: str) -> None:
        reset_peak()
        trainer.evaluate()
        peak = resident()[1]
        release_freed_memory()
        print(f"{label}: peak {peak}, after {resident()[0]} MiB")

    evaluation("evaluation")
    for step in range(1, args.steps + 1):
        phases.clear()
        trainer.train_step()
        trainer.step += 1
        print(f"step {step}: " + ", ".join(f"{name} peak {p} after {a}" for name, (p, a) in phases.items()) + " (MiB)")
    evaluation("evaluation")


if __name__ == "__main__":
    main()
