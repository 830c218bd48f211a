"""Epochs: each epoch's record (leader, challenge list, spot-check verifiers) and reputation.

- Epoch e covers heights (e−1)·L+1 … e·L (L = genesis `epoch_length`).
- Epoch 1 uses the seed sha256("planet/genesis" ‖ chain_id) where later epochs use H below
  (same leader, challenge-list and prompt-seed rules). At the last block of
  epoch e (height e·L) the committee fixes epoch e+1 from that block's hash H:
  leader = validators sorted by address, index sha256("planet/leader" ‖ H ‖ e+1) mod n;
  challenge list = SERVING compute nodes of the staked pools (`pool/`: staked, not left;
  unstaked registrations are never drawn) ordered by sha256("planet/challenge" ‖ H ‖ node key),
  the first `challenges_per_epoch` of them (all when 0), each with
  prompt_seed = sha256("planet/prompt" ‖ H ‖ node key ‖ e+1) — the verifier derives the prompt
  from the seed, so no two nodes get the same prompt and the leader cannot choose.
- Spot-check verifiers of epoch e+1 (fixed with its record, at height e·L): the consensus keys
  (64 hex, sorted) of the validators that committed a verifier seed for e+1 by then
  (`seed/<e+1>/<pub_key>`) and are not benched for a false accusation (abci_app/verdicts.py).
  The commitments made during epoch e are selected under e+1's seed and assigned among exactly
  these keys (protocol/spotcheck.py), so a node and every verifier read the same set from
  `/epochs`. Epoch 1 has none (no seed can precede genesis).
- Reputation: the agreed C(T) of epoch e (from vote extensions) updates R per
  protocol/reputation.py.
- Old epoch records go: closing epoch e (which writes `epoch/<e+1>`) deletes
  `epoch/<e-retention_epochs-1>`: the current record and the `retention_epochs + 1` before it
  stay.
"""

from __future__ import annotations

import hashlib
from typing import Any

from abci_app import registry, schema
from abci_app.state import State
from protocol import reputation


def _sha(*parts: bytes) -> bytes:
    return hashlib.sha256(b"".join(parts)).digest()


def _epoch_record(state: State, epoch: int, seed: bytes) -> dict[str, Any]:
    length = state.genesis.epoch_length
    addresses = [v["address"] for v in state.validators]
    tag = epoch.to_bytes(8, "big")
    leader = None
    if addresses:
        leader = addresses[
            int.from_bytes(_sha(b"planet/leader", seed, tag), "big") % len(addresses)
        ]
    serving = [key for key, _ in registry.staked_serving(state)]
    serving.sort(key=lambda k: _sha(b"planet/challenge", seed, bytes.fromhex(k)))
    limit = state.genesis.challenges_per_epoch
    chosen = serving[:limit] if limit else serving
    challenges = [
        {"node": key, "prompt_seed": _sha(b"planet/prompt", seed, bytes.fromhex(key), tag).hex()}
        for key in sorted(chosen)
    ]
    return {
        "epoch": epoch,
        "start_height": (epoch - 1) * length + 1,
        "end_height": epoch * length,
        "seed": seed.hex(),
        "leader": leader,
        "challenges": challenges,
        "verifiers": spot_check_verifiers(state, epoch),
        "reputation_applied": None,
    }


def spot_check_verifiers(state: State, epoch: int) -> list[str]:
    """Consensus keys of the validators with a seed committed for `epoch`, sorted; a validator
    benched for a false accusation (`vrep/<address>.benched_until` ≥ epoch) is left out."""
    out = []
    for validator in state.validators:
        key = validator["pub_key"]
        if state.get(schema.SEED, schema.in_epoch(epoch, key)) is None:
            continue
        mark = state.get(schema.VERIFIER_RECORD, validator["address"])
        if mark is not None and mark.get("benched_until", 0) >= epoch:
            continue
        out.append(key)
    return sorted(out)


def open_first_epoch(state: State) -> None:
    seed = _sha(b"planet/genesis", state.chain_id.encode())
    state.put(schema.EPOCH, "1", _epoch_record(state, 1, seed))
    state.put(schema.META, "current_epoch", 1)


def close_epoch(state: State, height: int, block_hash: bytes) -> None:
    """At height e·L: fix epoch e+1's leader and challenge list from this block's hash."""
    following = height // state.genesis.epoch_length + 1
    state.put(schema.EPOCH, str(following), _epoch_record(state, following, block_hash))
    state.put(schema.META, "current_epoch", following)
    old = following - state.genesis.retention_epochs - 2  # the record that left the window
    if old >= 1:
        state.delete(schema.EPOCH, str(old))
    state.emit("planet.epoch", epoch=following)


def apply_reputation(state: State, epoch: int, agreed: dict[str, int]) -> int:
    """Apply the agreed credibilities of `epoch`; returns how many nodes were updated."""
    params = state.genesis.reputation
    applied = 0
    for key in sorted(agreed):
        record = state.get(schema.REPUTATION, key)
        if record is None or record["last_epoch"] >= epoch:
            continue
        value, window = reputation.update(record["r"], tuple(record["window"]), agreed[key], params)
        state.put(
            schema.REPUTATION,
            key,
            {
                "r": value,
                "window": list(window),
                "epochs": record["epochs"] + 1,
                "last_epoch": epoch,
            },
        )
        applied += 1
    entry = state.get(schema.EPOCH, str(epoch))
    if entry is not None:
        state.put(schema.EPOCH, str(epoch), {**entry, "reputation_applied": applied})
    return applied
