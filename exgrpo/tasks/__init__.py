"""Tasks: questions with verifiable answers."""
