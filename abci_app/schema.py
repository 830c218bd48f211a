"""The committee chain's key-value schema: every namespace named once, with what it holds.

State is a set of entries (namespace, key) → JSON value (integers, strings, lists, objects; no
floats). Keys that carry an epoch spell it as 12 zero-padded digits (`epoch_key`) so that a
range read returns one epoch's entries in order; `epoch_range(e)` is that range. The value
shapes are part of the app hash and of the query answers: docs/committee.md "State".

Node lifecycle values (`node/<key>.status`) live here too: the registry writes them, the epoch,
settlement and query rules read them.
"""

from __future__ import annotations

# --- chain metadata and accounts -----------------------------------------------------------------

META = "meta"  # meta/{chain_id, ve_enable_height, genesis, validators} (InitChain), current_epoch
NONCE = "acct"  # acct/<signer hex>: the signer's last committed nonce (int)

# --- the node registry (registry.py) -------------------------------------------------------------

NODE = "node"  # node/<node key hex>: {key, evm_address, role, model, shards, endpoint, capacity,
# status, status_height, registered_height, last_heartbeat}
EVM_BINDING = "evm"  # evm/<lowercase EVM address>: the node key that address is bound to
STAKE = "stake"  # stake/<node key>: {attestations: {validator address: wei}, agreed, height}
REPUTATION = "rep"  # rep/<node key>: {r, window, epochs, last_epoch} (protocol/reputation.py)
HEARTBEAT_DUE = "hbdue"  # hbdue/<height>: node keys that are overdue at that height unless
# they sent a heartbeat since
REGISTRATION_DUE = "regdue"  # regdue/<height>: node keys whose unstaked registration expires
# at that height

JOIN, SERVING, DOWN, LEFT = "JOIN", "SERVING", "DOWN", "LEFT"  # node/<key>.status
EXPIRED = "EXPIRED"  # the status of the planet.node event when an unstaked registration expires

# --- commit-reveal, evidence, verdicts (commitments.py, verdicts.py) -----------------------------

COMMITMENT = "commit"  # commit/<node>/<session>/<step>/<shard>: {commitment, height[, output_hash,
# salt, revealed_height, match]}
EVIDENCE = "evidence"  # evidence/<0x sha256 of the record>: an equivocation or reveal mismatch
VERDICT = "verdict"  # verdict/<0x struct hash>: a Verdict's votes, power, confirmed[, settled]
VERDICT_DUE = "vdue"  # vdue/<epoch>: verdict ids whose accusation is settled when epoch closes
VERIFIER_RECORD = "vrep"  # vrep/<validator address>: {confirmed, refused, last_epoch} marks
SLASHED = "slashed"  # slashed/<epoch>/<lowercase account>: a verdict against the account was
# confirmed in that epoch: it earns nothing then (deleted when the epoch closes)

# --- epochs, verifier seeds, spot checks (epochs.py, seeds.py, spot_reports.py) ------------------

EPOCH = "epoch"  # epoch/<e, plain decimal>: {epoch, start_height, end_height, seed, leader,
# challenges, verifiers, reputation_applied}
SEED = "seed"  # seed/<epoch>/<validator key>: {epoch, validator, commitment, height, seed,
# revealed_height}
SPOT_REPORT = "spotrep"  # spotrep/<epoch checked>/<validator key>: {count, height}
SPOT_CREDIT = "vwork"  # vwork/<epoch credited>/<lowercase operator>: spot checks credited then

# --- settlement (settlement.py) ------------------------------------------------------------------

BACKING = "backing"  # backing/<node>/<model>/<shard>: gateway-reported layer-tokens not yet
# credited to the node
PENDING_QUERY = "squery"  # squery/<query id>: {fee, height}, reported and not yet settled
SETTLED_QUERY = "sqdone"  # sqdone/<query id>: the epoch whose payout root settled it
PENDING_CHARGE = "vpend"  # vpend/<payer>/<query id>: {fee, cap}, a prepaid charge to debit
SEEN_VOUCHER = "vseen"  # vseen/<payer>/<query id>: the voucher's expiry (replay guard)
CREDIT = "credit"  # credit/<epoch>/<account>/<shard, 5 digits>/<model>: {account, model, shard,
# layer_tokens}, a node's credited work of that epoch
PAYOUT = "payout"  # payout/<epoch>: the epoch's PayoutRoot statement, rows, votes, confirmed

# --- retention (retention.py, rules.track*) ------------------------------------------------------

PRUNE_INDEX = "gc"  # gc/<epoch>/<ns>/<key>: delete ns/key once epoch is settled and retained
EXPIRY_INDEX = "gcexp"  # gcexp/<unix time, 20 digits>/<ns>/<key>: delete ns/key after that time


def epoch_key(epoch: int) -> str:
    """An epoch as the leading part of a key: 12 zero-padded digits."""
    return f"{epoch:012d}"


def epoch_range(epoch: int) -> tuple[str, str]:
    """(start, stop) of the keys `<epoch>/…` of a namespace: start ≤ key < stop."""
    return f"{epoch:012d}/", f"{epoch:012d}0"


def in_epoch(epoch: int, name: str) -> str:
    """`<epoch>/<name>`: an entry of an epoch-keyed namespace (seed, spotrep, vwork, slashed)."""
    return f"{epoch_key(epoch)}/{name}"


def commitment_key(node: str, session: str, step: int, shard: int) -> str:
    return f"{node}/{session}/{step}/{shard}"


def backing_key(node: str, model: str, shard: int) -> str:
    return f"{node}/{model}/{shard}"


def charge_key(payer: str, query_id: str) -> str:
    return f"{payer}/{query_id}"


def credit_key(epoch: int, account: str, model: str, shard: int) -> str:
    return f"{epoch_key(epoch)}/{account.lower()}/{shard:05d}/{model}"


def prune_key(epoch: int, ns: str, key: str) -> str:
    return f"{epoch_key(epoch)}/{ns}/{key}"


def expiry_key(until: int, ns: str, key: str) -> str:
    return f"{until:020d}/{ns}/{key}"
