"""The ExGRPO loss as veRL's policy-loss registry hands it out: the native trainer's loss function.

:func:`~exgrpo.core.loss.compute_exgrpo_policy_loss` is registered under ``exgrpo`` in veRL's
``POLICY_LOSS_REGISTRY`` and taken back from it, so the CPU tests exercise what veRL's registry returns.
"""

from __future__ import annotations

import logging
import os
import warnings

from exgrpo.core.loss import PolicyLossFn, compute_exgrpo_policy_loss

LOSS_NAME = "exgrpo"
"""Key of the ExGRPO mixed-policy loss in veRL's POLICY_LOSS_REGISTRY."""


def _import_core_algos():
    """veRL's ``core_algos``, imported on first use (veRL is heavy), quietly."""
    os.environ.setdefault("WANDB_MODE", "disabled")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("verl").setLevel(logging.ERROR)
        from verl.trainer.ppo import core_algos
    return core_algos


def register() -> None:
    """Register :func:`compute_exgrpo_policy_loss` under ``exgrpo`` (idempotent)."""
    core_algos = _import_core_algos()
    if core_algos.POLICY_LOSS_REGISTRY.get(LOSS_NAME) is not compute_exgrpo_policy_loss:
        core_algos.register_policy_loss(LOSS_NAME)(compute_exgrpo_policy_loss)


def get_exgrpo_loss_fn() -> PolicyLossFn:
    """The ExGRPO loss as veRL's registry returns it."""
    register()
    return _import_core_algos().get_policy_loss_fn(LOSS_NAME)
