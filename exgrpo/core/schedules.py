"""When replay is on: the one-way start switch (paper) and the notebook's lambda schedule."""

from __future__ import annotations

from dataclasses import dataclass

from exgrpo.config import NotebookReplayConfig


@dataclass
class ReplayStartSwitch:
    """Turns replay on, for good, once a batch's pass@1 exceeds ``threshold`` (spec §7).

    The switch is checked after a step; collection starts on the first step with the switch on,
    replay on the next one (the pool is empty before). Saved and restored with the checkpoint.
    """

    threshold: float = 0.35
    started: bool = False
    started_at_step: int = -1

    def update(self, batch_pass_rate: float, step: int) -> bool:
        """Record one step's batch pass@1; returns whether replay is on from the next step."""
        if not self.started and batch_pass_rate > self.threshold:
            self.started, self.started_at_step = True, step
        return self.started

    def state_dict(self) -> dict:
        return {"threshold": self.threshold, "started": self.started, "started_at_step": self.started_at_step}

    def load_state_dict(self, state: dict) -> None:
        self.threshold = float(state["threshold"])
        self.started = bool(state["started"])
        self.started_at_step = int(state["started_at_step"])


def notebook_lambda(epoch: int, cfg: NotebookReplayConfig) -> float:
    """Mixing weight of the off-policy loss at ``epoch`` (0-based) in the notebook variant:
    0 up to ``warm``; min(lambda_max, alpha*(epoch-warm)) up to ``peak``; then
    max(lambda_min, lambda_max - beta*(epoch-peak))."""
    if epoch < cfg.warm:
        return 0.0
    if epoch < cfg.peak:
        return min(cfg.lambda_max, cfg.alpha * (epoch - cfg.warm))
    return max(cfg.lambda_min, cfg.lambda_max - cfg.beta * (epoch - cfg.peak))
