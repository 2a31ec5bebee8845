"""Planted faults for the veRL backend's tests, selected by veRL's own
``actor_rollout_ref.rollout.checkpoint_manager_class`` setting.

They live in the package (not in a test module) because veRL loads the class by its dotted name in
the job's driver, whatever the test's import mode. Nothing imports this module otherwise.

* :class:`SyncOnce`: the rollout gets the actor's weights once, before step 1, and never again (the
  negative control of the weight-sync test: the rollout's log-probs drift from the actor's).
* :class:`KillRollout`: the rollout servers and their workers are killed at the first weight sync
  (a rollout server that dies under a run).
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


class KillRollout(CheckpointEngineManager):
    def update_weights(self, global_steps: int | None = None):
        if not getattr(self, "_killed", False):
            self._killed = True
            for replica in self.replicas:
                for server in getattr(replica, "servers", []):
                    ray.kill(server, no_restart=True)
                for worker in replica.workers:
                    ray.kill(worker, no_restart=True)
        return super().update_weights(global_steps)
