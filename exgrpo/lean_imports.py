"""Optional imports exgrpo's processes leave out.

transformers imports scikit-learn, and through it SciPy's statistics and joblib, whenever it is
installed (MLflow requires it), for one thing: the ROC curve of assisted generation's confidence
threshold, which exgrpo never uses. That costs about 1.1 s of CPU in every process that loads a model
class (median, AMD EPYC Zen 3): the CLI, a veRL job's driver and each of its five Ray actors, a native run's
workers. :func:`install` makes transformers decide, the first time it asks, that scikit-learn is
absent (the answer is cached for the process), while scikit-learn stays importable for anything else.

It is installed when ``exgrpo`` is imported, and in every Ray worker exgrpo starts (a veRL job's, a
comparison's or a sweep's) through Ray's ``worker_process_setup_hook`` (:data:`RAY_SETUP_HOOK`), which
runs before a task's or an actor's class, and with it veRL and transformers, is loaded.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

RAY_SETUP_HOOK = "exgrpo.lean_imports.install"
"""``runtime_env["worker_process_setup_hook"]`` of the Ray jobs exgrpo starts: their workers install this too."""

_DECIDER = "transformers.utils.import_utils"
"""The module whose ``is_sklearn_available`` (an ``lru_cache``) transformers asks."""


def _decide_without_sklearn(module) -> None:
    """Ask ``module.is_sklearn_available()`` once while ``sklearn`` cannot be found: its cached answer is no."""
    ask = getattr(module, "is_sklearn_available", None)
    if ask is None or "sklearn" in sys.modules:  # another transformers, or scikit-learn already loaded
        return
    sys.modules["sklearn"] = None  # find_spec("sklearn") is None while this stands
    try:
        ask()
    finally:
        del sys.modules["sklearn"]


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when transformers' import utilities are first imported, wraps their loader
    so that the module decides about scikit-learn as soon as it has run."""

    def find_spec(self, name, path, target=None):
        if name != _DECIDER:
            return None
        uninstall()  # once: the lookup below must reach the real finders
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module) -> None:
            run(module)
            _decide_without_sklearn(module)

        spec.loader.exec_module = exec_module  # this module's own loader instance
        return spec


_FINDER = _Finder()


def install() -> None:
    """Make transformers, when it is imported in this process, go without scikit-learn (idempotent).
    Nothing to do where transformers is loaded already."""
    if _DECIDER in sys.modules:
        _decide_without_sklearn(sys.modules[_DECIDER])
    elif _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
