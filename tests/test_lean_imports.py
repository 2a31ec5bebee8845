"""Processes of exgrpo load transformers without scikit-learn, which transformers would import for
nothing exgrpo uses (exgrpo/lean_imports.py)."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # each test loads transformers in a fresh interpreter (about 7 s of CPU)

_LOAD = (
    "import sys\n"
    "{first}"
    "from transformers import LlamaForCausalLM\n"
    "print('sklearn' in sys.modules)\n"
    "import sklearn.metrics\n"  # still there for anything else that wants it
    "print(sklearn.metrics.roc_curve.__name__)\n"
)


def _load(first: str) -> list[str]:
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", _LOAD.format(first=first)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


def test_transformers_loads_scikit_learn_in_a_process_without_exgrpo():
    """What the rest guards against: installed (MLflow requires it), scikit-learn comes with a model class."""
    assert _load("") == ["True", "roc_curve"]


def test_a_process_that_imports_exgrpo_loads_transformers_without_scikit_learn_which_stays_importable():
    assert _load("import exgrpo\n") == ["False", "roc_curve"]


def test_after_transformers_is_loaded_installing_changes_nothing_it_decided():
    """Too late to gain anything: transformers keeps what it loaded, and nothing breaks."""
    first = "import transformers.generation.candidate_generator\nimport exgrpo\n"
    assert _load(first) == ["True", "roc_curve"]
