"""The network's commands of `planet`: `devnet`, `committee` and `contracts` start, inspect and
stop what deploy/ orchestrates. Each module exposes `register(subparsers)` like node.cli's groups;
the `planet` entry point (planet/main.py) registers them beside node's user and operator commands.
"""
