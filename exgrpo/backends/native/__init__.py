"""Native PyTorch backend: policies, tasks' rollouts and the trainer loop, runnable on a CPU."""
