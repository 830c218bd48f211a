#!/usr/bin/env bash
# The README's main command: prepare the default model in 3 shards, start 3 local compute nodes,
# ask them a question, stop them. Installs what it needs first (deploy/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
export PATH="$PWD/.venv/bin:$PWD/.tools/bin:$PATH"
QUESTION=${1:-"In one sentence, what is a layer of a neural network?"}
planet model prepare --parts 3 --quant int8
trap 'planet local down' EXIT
planet local up --nodes 3 --quant int8
planet ask "$QUESTION"
