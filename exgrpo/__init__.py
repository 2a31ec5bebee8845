"""ExGRPO Lab: GRPO with experience replay (arXiv 2510.02245), as a small tested core plus backends."""

__version__ = "0.1.0"
