"""The algorithm: experience pool, bucket sampler, trajectory selection, advantages, mixed-policy
loss and replay schedules. Pure torch/numpy, no I/O, no orchestration."""
