"""What several ``exgrpo`` commands share: loading a Prefect flow, the ``--ray-address`` help.

Standard library only at import time, like every module of :mod:`exgrpo.cli`: ``exgrpo --help`` stays
free of torch, Ray, MLflow and Prefect.
"""

from __future__ import annotations

RAY_ADDRESS_HELP = ("Ray cluster to run on, e.g. 10.0.0.5:6379 (default: RAY_ADDRESS, else a private local Ray); "
                    "needs RAY_AUTH_TOKEN for a token-auth cluster and an MLflow server every node reaches")


class FlowMissing(RuntimeError):
    """A Prefect flow of the ``flows`` package cannot be imported."""


def load_flow(module: str, name: str):
    """Flow ``name`` of the installed ``flows`` package (``flows/<module>.py``), to run on the project's
    Prefect home and API (:mod:`exgrpo.prefect_home`: what ``exgrpo ui`` shows) with the settings it
    needs on these machines unless the environment already sets them. A missing flow is a one-line
    error, never a silent fallback."""
    import importlib

    from exgrpo.prefect_home import use_prefect_home

    use_prefect_home()  # before Prefect is imported: it reads its settings then
    try:
        return getattr(importlib.import_module(f"flows.{module}"), name)
    except (ImportError, AttributeError) as e:
        raise FlowMissing(
            f"the Prefect flow flows/{module}.py:{name} cannot be loaded ({e}); reinstall with `make venv`, "
            "or pass --no-prefect to run without Prefect"
        ) from e
