"""Prefect flows (thin: parse config, call exgrpo, report). Deployments: ../prefect.yaml."""
