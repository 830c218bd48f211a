#!/usr/bin/env bash
# The README's main command: the whole Planet network on this machine — anvil with the contracts,
# a 4-validator CometBFT committee with its stake watchers, 3 compute nodes staked and joined with
# `planet stake` / `planet join`, the gateway — then one question. Installs what it needs first
# (deploy/setup.sh); everything is stopped again on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
export PATH="$PWD/.venv/bin:$PWD/.tools/bin:$PATH"
export PLANET_HOME=${PLANET_HOME:-$HOME/.cache/planet}
# Every process of the devnet imports torch or the web3 stack; where the environment sets
# PYTHONDONTWRITEBYTECODE none of them keeps the compiled modules, so each compiles them from
# source again: a node started in 4.0 CPU-s against 2.2 with the caches (py-spy, this 2-core
# machine). The devnet's first processes write them here, and later `planet` commands read them.
unset PYTHONDONTWRITEBYTECODE
QUESTION=${1:-"In one sentence, what is a layer of a neural network?"}
trap 'planet devnet down' EXIT
planet devnet up --detach
# The paid question through the gateway: a deposit from the devnet user's wallet into the
# escrow, the signed payment proof as the API key, the streamed answer, the gateway's receipt.
planet ask --pay --wallet "$PLANET_HOME/devnet/user/wallet.json" \
  --password-file "$PLANET_HOME/devnet/password" "$QUESTION"
