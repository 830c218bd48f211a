#!/usr/bin/env bash
# The README's test command: installs what it needs (deploy/setup.sh), then runs every check.
# Extra pytest arguments pass through: `bash deploy/test.sh -k frames`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
export PATH="$PWD/.venv/bin:$PWD/.tools/bin:$PWD/node_modules/.bin:$PATH"
step() { printf '\n== %s\n' "$*" >&2; }

step "lint: ruff + import boundaries"
ruff check .
lint-imports --no-cache

step "python: unit, integration and e2e tests"
pytest tests "$@"
