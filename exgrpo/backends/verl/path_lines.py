"""The lines a veRL job prints for each device path it takes (:mod:`.platform.path_report` prints them),
and what each must say on each device.

Standard library only: ``exgrpo gpu-smoke`` and the tests read a job's log with it, outside the job.
"""

from __future__ import annotations

PREFIX = "exgrpo path"
PATHS = ("sleep-mode", "weight-sync", "actor", "collectives")
"""Every name a line may carry, in the order a step takes them."""

EXPECTED = {
    "cuda": {"sleep-mode": "vLLM released its GPU memory", "weight-sync": "CUDA IPC buckets",
             "actor": "inputs torch.bfloat16", "collectives": "nccl"},
    "cpu": {"sleep-mode": "off", "weight-sync": "shared-memory buckets",
            "actor": "inputs torch.float32", "collectives": "cpu:gloo ("},
}
"""device -> path -> what its line must contain when the device's own path ran (the cuda row: vLLM's
sleep mode, the CUDA IPC weight sync, the actor's bf16 compute, NCCL; the cpu row: what the CPU
overrides choose instead)."""


def line(name: str, text: str) -> str:
    return f"{PREFIX} {name}: {text}"


def parse(log: str) -> dict[str, list[str]]:
    """``name`` -> the texts of its lines in a job's log (every process's, in order; Ray's prefixes such as
    ``(WorkerDict pid=12)`` ignored)."""
    found: dict[str, list[str]] = {}
    marker = f"{PREFIX} "
    for row in log.splitlines():
        at = row.find(marker)
        if at < 0:
            continue
        name, sep, text = row[at + len(marker):].partition(": ")
        if sep and name in PATHS:
            found.setdefault(name, []).append(text.strip())
    return found


def verdicts(log: str, device: str) -> list[tuple[bool, str, str]]:
    """(ran as expected, path, what its first line says, or why it failed) for every path of :data:`PATHS`,
    read from a job's ``log`` for a run on ``device``."""
    found, out = parse(log), []
    for name in PATHS:
        want = EXPECTED[device][name]
        texts = found.get(name, [])
        if not texts:
            out.append((False, name, "no line: the job never took this path (see verl.log)"))
            continue
        good = [t for t in texts if want in t]
        out.append((True, name, good[0]) if good else (False, name, f"expected {want!r} on {device}, got: {texts[0]}"))
    return out
