"""The native backend: the in-process CPU trainer loop, its checkpoints and its loss (the policies it
trains are :mod:`exgrpo.policies`, shared with the veRL backend)."""
