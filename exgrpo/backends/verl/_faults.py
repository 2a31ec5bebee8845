"""Planted faults for the veRL backend's tests, selected by veRL's own
``actor_rollout_ref.rollout.checkpoint_manager_class`` setting.

They live in the package (not in a test module) because veRL loads the class by its dotted name in
the job's driver, whatever the test's import mode. Nothing imports this module otherwise.

* :class:`SyncOnce`: the rollout gets the actor's weights once, before step 1, and never again (the
  negative control of the weight-sync test: the rollout's log-probs drift from the actor's).
* :class:`SyncOnceThenKill`: the same drift for two steps, then the rollout servers and their
  workers are killed at step 3's weight sync (a rollout server that dies under a run): one launch
  serves both the negative control and the failure test.
"""

from __future__ import annotations

import ray
from verl.checkpoint_engine import CheckpointEngineManager


class SyncOnce(CheckpointEngineManager):
    def update_weights(self, global_steps: int | None = None):
        if getattr(self, "_synced", False):
            return {}
        self._synced = True
        return super().update_weights(global_steps)


def _kill_rollout(manager: CheckpointEngineManager) -> None:
    for replica in manager.replicas:
        for server in getattr(replica, "servers", []):
            ray.kill(server, no_restart=True)
        for worker in replica.workers:
            ray.kill(worker, no_restart=True)


class SyncOnceThenKill(SyncOnce):
    """veRL syncs with ``global_steps`` 0 before step 1 and with N inside step N, after the actor's
    update and before the step's metrics are logged: killed there at step 3, the run has logged
    steps 1 and 2 (step 2 on stale weights) and fails in step 3."""

    def update_weights(self, global_steps: int | None = None):
        if getattr(self, "_synced", False) and global_steps is not None and global_steps >= 3:
            _kill_rollout(self)
            return CheckpointEngineManager.update_weights(self, global_steps)  # into the dead servers
        return super().update_weights(global_steps)
