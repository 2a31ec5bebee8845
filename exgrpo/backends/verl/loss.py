"""Register the ExGRPO policy loss in veRL's policy-loss registry, and fetch it from there.

The native trainer calls :func:`get_exgrpo_loss_fn`, i.e. the function veRL's registry returns, so
every CPU test of the loss exercises what a veRL actor would call with
``actor.policy_loss.loss_mode=exgrpo``.

GPU note: veRL 0.9.1's ``workers/utils/losses.ppo_loss`` passes only veRL's own fields to the loss;
the GPU trainer must also forward the batch's ``off_policy_mask`` (a per-token bool field) as the
``off_policy_mask`` keyword. Without it every token is treated as fresh (plain GRPO).
"""

from __future__ import annotations

import logging
import os
import warnings

from exgrpo.core.loss import PolicyLossFn, compute_exgrpo_policy_loss

LOSS_NAME = "exgrpo"
"""Key of the ExGRPO mixed-policy loss in veRL's POLICY_LOSS_REGISTRY."""


def _import_core_algos():
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
