"""The veRL backend: ExGRPO on veRL 0.9.1's RayPPOTrainer (CPU via the ``platform`` plugin here,
vLLM + NCCL on GPUs). ``runner.VERL`` is the backend object :func:`exgrpo.backends.base.get_backend`
returns; ``trainer.ExGRPORayTrainer`` is the thin adapter around :mod:`exgrpo.core.replay`."""
