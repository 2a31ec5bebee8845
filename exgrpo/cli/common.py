"""What several ``exgrpo`` commands share: loading a Prefect flow, keeping passwords out of its
parameters, the ``--ray-address`` help.

Standard library only at import time, like every module of :mod:`exgrpo.cli`: ``exgrpo --help`` stays
free of torch, Ray, MLflow and Prefect.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from exgrpo.errors import redact_uri

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


@contextmanager
def secrets_by_environment() -> Iterator[Callable[[str | None, str], str | None]]:
    """For the block: ``hide(uri, VARIABLE)`` gives what a flow's parameter may hold. A URI that carries
    a password is put in the environment variable ``VARIABLE`` the flow reads when the parameter is None
    (``MLFLOW_TRACKING_URI``, ``EXGRPO_OPTUNA_STORAGE``), and None is the parameter: Prefect stores a flow
    run's parameters where anyone who reaches its UI or API reads them. Any other value is the parameter
    itself. The variables are as they were once the block ends."""
    before: dict[str, str | None] = {}

    def hide(uri: str | None, variable: str) -> str | None:
        if not isinstance(uri, str) or redact_uri(uri) == uri:
            return uri
        before.setdefault(variable, os.environ.get(variable))
        os.environ[variable] = uri
        return None

    try:
        yield hide
    finally:
        for variable, value in before.items():
            if value is None:
                os.environ.pop(variable, None)
            else:
                os.environ[variable] = value
