"""The user and operator commands of `planet` (the entry point that composes them with the
network's commands of deploy/cli/ is planet/main.py)."""
