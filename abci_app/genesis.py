"""Genesis parameters of the committee chain, parsed once from InitChain's `app_state` JSON.

    {
      "epoch_length": 20,                 # blocks per epoch (epoch e = heights (e-1)·L+1 .. e·L)
      "heartbeat_timeout": 30,            # a JOIN/SERVING node whose last heartbeat is more than
                                          #   this many blocks old becomes DOWN
      "challenges_per_epoch": 0,          # nodes challenged per epoch (0 = every SERVING node)
      "registration_ttl": 100,            # blocks an unstaked registration lives (retention.py)
      "retention_epochs": 10,             # settled epochs whose records stay before pruning
      "prune_per_block": 10000,           # most records pruned in one block
      "min_stake": {"compute": "1000000000000000000", "verifier": "500000000000000000",
                    "relay": "100000000000000000"},  # wei, per role (as the Staking contract's)
      "reputation": {"tau": 300000, "untrusted_below": 400000, "initial": 500000,
                     "alpha": 400000, "beta": 600000, "window": 5,
                     "gamma_num": 1, "gamma_den": 5},  # integers at 10**6, see reputation.py
      "models": {"smollm2-135m": {"shards": 3}},              # optional: shard count per model
      "evm": {"chain_id": 31337, "committee_address": "0x…",  # EIP-712 domain of verdicts
              "fraud_proofs_address": "0x…"},  # the verdicts' consumer (FraudProofs)
      "validators": {"<validator address hex | base64 pub_key>": "0x<operator EVM address>"},
      "verifier_cut_bps": 1000,             # verifiers' part of each epoch's fees
      "spot_check_ppm": 50000,              # spot-check selection rate (protocol/spotcheck.py)
      "spot_check_floor": 1,                # expected checks per node and epoch at least (0: off)
      "commit_grace_epochs": 2,             # epochs a node has to commit what credits bought
      "replica_floor": 2,                   # routable nodes each shard should have at least:
                                          #   joiners fill shards below it first (/pool_health)
      "numerics": [2],                      # the numerics versions a register_node may announce
                                          #   (protocol/numerics.py): 1..8 distinct integers
                                          #   1..65535, ascending; each run by verifiers of
                                          #   >= 2/3 of the power (docs/verification.md)
      "credits": {"price_wei": "1000000000000", "layer_tokens": 4096,  # one credit's price
                  "lifetime_epochs": 4320,  #   and the layer-tokens its redemption credits; a
                                          #   credit of epoch e is redeemable up to epoch
                                          #   e + lifetime_epochs (default 4320: a day of
                                          #   20 s epochs)
                  "max_pending_mints": 4,  # unfunded mints one payer may hold at once
                  "relay_bytes": 1048576,  # clove bytes that arrived one credit pays a relay for
                  "key_period_blocks": 86400,  # blocks of one credit key period (≈ a day at
                                          #   ~1 s blocks): the committee's blind-BLS key X_p
                                          #   and the anonymity set of its credits
                  "dkg_phase_blocks": 20,  # blocks of each DKG phase (deal, complaint,
                                          #   justify); 3 · this < key_period_blocks
                  "holder_bound": false,  # true: a credit is locked or redeemed only with its
                                          #   holder's assignment to the signer (issue 42;
                                          #   abci_app/credit_holders.py); false: as before
                  "sign_blocks": 300}  # blocks after its funding a mint has to get t valid
                                          #   posted partial sets (`mint_partials`); fewer by
                                          #   then: its price is refunded to its payer
                                          #   (abci_app/mint_partials.py)
    }
`evm.escrow_address` (the QueryEscrow that consumes `PayoutRoot`s) enables epoch settlement;
`credits` (with the escrow) enables minting and redeeming credits (abci_app/credits.py).

Every field is optional (defaults above; without `evm` and its `fraud_proofs_address`, verdict
votes are refused). Unknown
keys are rejected so a typo cannot silently fall back to a default.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field
from typing import Any

from protocol.canonical import JsonInputError, parse_json
from protocol.errors import ConfigError
from protocol.fields import is_int
from protocol.numerics import MAX_NUMERICS
from protocol.reputation import ReputationParams

_KEYS = {
    "epoch_length",
    "heartbeat_timeout",
    "challenges_per_epoch",
    "registration_ttl",
    "retention_epochs",
    "prune_per_block",
    "min_stake",
    "reputation",
    "models",
    "evm",
    "validators",
    "verifier_cut_bps",
    "spot_check_ppm",
    "spot_check_floor",
    "commit_grace_epochs",
    "credits",
    "replica_floor",
    "numerics",
}
DEFAULT_MIN_STAKE = {"compute": 10**18, "verifier": 5 * 10**17, "relay": 10**17}
MAX_PARAM = (1 << 63) - 1
# How long a credit stays redeemable, in epochs after its mint's: long enough that credits a
# user bought are still worth something after a break (a day of 20-block epochs at ~1 s), short
# enough that the spent set (kept for that long) stays bounded.
DEFAULT_CREDIT_LIFETIME_EPOCHS = 4_320
MAX_CREDIT_LIFETIME_EPOCHS = 1_000_000
# Unfunded mints one payer may hold at once (its mints of the epochs still fundable): mint txs
# cost nothing to send, so without a bound one payer could bury its own in-flight mint, or the
# watchers' work list, under junk (issue 42). A client buys one mint at a time.
DEFAULT_MAX_PENDING_MINTS = 4
MAX_MAX_PENDING_MINTS = 64
# A relay's rate (docs/overlay.md "Relays are paid"): clove bytes one credit pays a relay for,
# counted on a path after they arrived (the node's acknowledgement forward, the client's own
# count backward). One rule for every relay, read by clients from `/credit_keys`, so no relay
# sets its own price. Bytes, not cloves: a prefill's clove can be 10^4 times a token's.
DEFAULT_RELAY_BYTES = 1 << 20
MAX_RELAY_BYTES = 1 << 40
# A credit key period (docs/credits.md "Key periods"): one committee key X_p per period, made by
# an on-chain DKG (abci_app/credit_dkg.py) whose three phases of `dkg_phase_blocks` each end
# before the period starts. Long periods give large anonymity sets (a credit names its period).
DEFAULT_KEY_PERIOD_BLOCKS = 86_400
DEFAULT_DKG_PHASE_BLOCKS = 20
MAX_KEY_PERIOD_BLOCKS = 10_000_000
# The signing deadline of a funded mint (docs/credits.md "A paid mint gives credits or a refund"):
# blocks after the funding block by which t validators' partial signatures must be posted on the
# chain (`mint_partials`), or its price goes back to its payer. Each validator's watcher posts
# its set within a pass or two (seconds); ~5 minutes at ~1 s blocks leaves room for restarts.
DEFAULT_SIGN_BLOCKS = 300
MAX_SIGN_BLOCKS = 1_000_000
_CREDIT_KEYS = {
    "price_wei",
    "layer_tokens",
    "lifetime_epochs",
    "max_pending_mints",
    "relay_bytes",
    "key_period_blocks",
    "dkg_phase_blocks",
    "holder_bound",
    "sign_blocks",
}
MAX_SHARDS = 65536  # register_node shard indexes are 0 … 65535
# Routable nodes a shard should have at least (issue 44): with one, a node that stalls leaves
# its shard with nobody; placement fills shards below the floor first (node/agent/placement.py)
DEFAULT_REPLICA_FLOOR = 2
MAX_REPLICA_FLOOR = 64
# The numerics versions (protocol/numerics.py) a `register_node` may announce (issue 46): a
# version no verifier runs would exempt its announcer from every bitwise spot check, so the
# chain accepts only those its genesis lists. The default is a literal, never `NUMERICS`: a
# chain's rules must not move with the release a validator runs (two releases would disagree
# on the same registration and fork); a genesis that wants another list names it.
DEFAULT_NUMERICS = (2,)
MAX_ACCEPTED_NUMERICS = 8  # more versions live at once than an upgrade ever needs
_DECIMAL = re.compile(r"[0-9]{1,78}\Z")  # ASCII only: str.isdigit accepts other scripts


def _int(doc: dict[str, Any], key: str, default: int, lo: int = 0, hi: int = MAX_PARAM) -> int:
    value = doc.get(key, default)
    if isinstance(value, str) and _DECIMAL.match(value):
        value = int(value)
    if not is_int(value, lo, hi):
        raise ConfigError(
            f"genesis app_state.{key}: expected an integer in [{lo}, {hi}], got {value!a}"
        )
    return value


def _numerics(doc: dict[str, Any]) -> tuple[int, ...]:
    """`numerics`: 1..MAX_ACCEPTED_NUMERICS JSON integers 1..MAX_NUMERICS, strictly ascending
    (one encoding per list: duplicates and reorderings refused); absent: DEFAULT_NUMERICS. An
    empty list is refused: every release that announces would be shut out."""
    value = doc.get("numerics", list(DEFAULT_NUMERICS))
    if (
        not isinstance(value, list)
        or not 1 <= len(value) <= MAX_ACCEPTED_NUMERICS
        or not all(type(v) is int and 1 <= v <= MAX_NUMERICS for v in value)
        or any(a >= b for a, b in itertools.pairwise(value))
    ):
        raise ConfigError(
            f"genesis app_state.numerics: expected 1 to {MAX_ACCEPTED_NUMERICS} distinct "
            f"integers in [1, {MAX_NUMERICS}], ascending, got {ascii(value)[:80]}"
        )
    return tuple(value)


def _key_periods(credits: dict[str, Any] | None) -> tuple[int, int]:
    """(key_period_blocks, dkg_phase_blocks): a DKG's three phases fit in one period."""
    if credits is None:
        return DEFAULT_KEY_PERIOD_BLOCKS, DEFAULT_DKG_PHASE_BLOCKS
    period = _int(credits, "key_period_blocks", DEFAULT_KEY_PERIOD_BLOCKS, 4, MAX_KEY_PERIOD_BLOCKS)
    phase = _int(credits, "dkg_phase_blocks", DEFAULT_DKG_PHASE_BLOCKS, 1, MAX_KEY_PERIOD_BLOCKS)
    if 3 * phase >= period:
        raise ConfigError(
            "genesis app_state.credits: 3 · dkg_phase_blocks must be below key_period_blocks"
        )
    return period, phase


def _is_address(value: Any) -> bool:
    return (
        isinstance(value, str)
        and len(value) == 42
        and value.startswith("0x")
        and all(c in "0123456789abcdefABCDEF" for c in value[2:])
    )


@dataclass(frozen=True, slots=True)
class Genesis:
    epoch_length: int = 20
    heartbeat_timeout: int = 30
    challenges_per_epoch: int = 0
    registration_ttl: int = 100
    retention_epochs: int = 10
    prune_per_block: int = 10_000
    min_stake: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_MIN_STAKE))
    reputation: ReputationParams = field(default_factory=ReputationParams)
    models: dict[str, int] = field(default_factory=dict)
    evm_chain_id: int | None = None
    committee_address: str | None = None
    fraud_proofs_address: str | None = None  # Verdict.consumer
    operators: dict[str, str] = field(default_factory=dict)  # raw key → operator address
    escrow_address: str | None = None  # PayoutRoot.consumer (QueryEscrow); None: no settlement
    verifier_cut_bps: int = 1_000
    spot_check_ppm: int = 50_000  # selection rate the chain credits spot-check reports under
    spot_check_floor: int = 1  # a node's blocks of an epoch are drawn at ≥ floor / blocks
    commit_grace_epochs: int = 2  # bought positions must be committed within this many epochs
    replica_floor: int = DEFAULT_REPLICA_FLOOR  # routable nodes a shard should have at least
    numerics: tuple[int, ...] = DEFAULT_NUMERICS  # versions a register_node may announce
    credit_price_wei: int | None = None  # one credit's price; None: credits disabled
    credit_layer_tokens: int = 0  # layer-tokens a redeemed credit adds to the node's work
    credit_lifetime_epochs: int = DEFAULT_CREDIT_LIFETIME_EPOCHS  # redeemable in e … e + this
    credit_max_pending_mints: int = DEFAULT_MAX_PENDING_MINTS  # a payer's unfunded mints at once
    credit_relay_bytes: int = DEFAULT_RELAY_BYTES  # clove bytes a credit pays a relay for
    credit_key_period_blocks: int = DEFAULT_KEY_PERIOD_BLOCKS  # blocks of one credit key period
    credit_dkg_phase_blocks: int = DEFAULT_DKG_PHASE_BLOCKS  # blocks of each DKG phase
    credit_holder_bound: bool = False  # locks and redemptions carry holders' assignments
    credit_sign_blocks: int = DEFAULT_SIGN_BLOCKS  # blocks after funding to post t partial sets

    @classmethod
    def parse(cls, app_state: bytes) -> Genesis:
        if not app_state.strip():
            return cls()
        try:
            doc = parse_json(app_state, max_bytes=16 * 1024 * 1024, max_depth=8)
        except JsonInputError as error:
            raise ConfigError(f"genesis app_state is not JSON ({error.message})") from None
        if not isinstance(doc, dict):
            raise ConfigError("genesis app_state: expected an object")
        if "gateway_addresses" in doc:
            raise ConfigError(
                "genesis app_state.gateway_addresses was removed: a gateway binds its key to its "
                "payee address on chain with a `gateway` tx (docs/committee.md, Gateway bindings)"
            )
        if "gateways" in doc:
            raise ConfigError(
                "genesis app_state.gateways was removed: no list of gateways is trusted; any key "
                "bound by a `gateway` tx reports, and coverage and liveness read only the nodes' "
                "own txs (docs/committee.md, Commitment coverage)"
            )
        unknown = set(doc) - _KEYS
        if unknown:
            raise ConfigError(f"genesis app_state: unknown keys {sorted(unknown)}")
        rep = doc.get("reputation", {})
        try:
            if not isinstance(rep, dict):
                raise TypeError("expected an object")
            reputation = ReputationParams(**rep)
        except (TypeError, ValueError) as error:
            raise ConfigError(f"genesis app_state.reputation: {error}") from None
        min_stake = dict(DEFAULT_MIN_STAKE)
        stakes = doc.get("min_stake", {})
        if not isinstance(stakes, dict):
            raise ConfigError("genesis app_state.min_stake: expected an object")
        for role, amount in stakes.items():
            if role not in min_stake or not _DECIMAL.match(str(amount)):
                raise ConfigError(f"genesis app_state.min_stake.{role}: bad entry {amount!r}")
            min_stake[role] = int(amount)
        models: dict[str, int] = {}
        specs = doc.get("models", {})
        if not isinstance(specs, dict):
            raise ConfigError("genesis app_state.models: expected an object")
        for model, spec in specs.items():
            shards = spec.get("shards") if isinstance(spec, dict) else None
            if isinstance(shards, bool) or not isinstance(shards, int):
                shards = 0
            if not 1 <= shards <= MAX_SHARDS:
                raise ConfigError(
                    f"genesis app_state.models.{model}.shards: expected an integer in "
                    f"[1, {MAX_SHARDS}]"
                )
            models[model] = shards
        evm = doc.get("evm") or {}
        if not isinstance(evm, dict):
            raise ConfigError("genesis app_state.evm: expected an object")
        chain_id = evm.get("chain_id")
        committee = evm.get("committee_address")
        if evm and (not isinstance(chain_id, int) or not isinstance(committee, str)):
            raise ConfigError("genesis app_state.evm: expected {chain_id: int, committee_address}")
        fraud_proofs = evm.get("fraud_proofs_address")
        if fraud_proofs is not None and not (
            isinstance(fraud_proofs, str)
            and len(fraud_proofs) == 42
            and fraud_proofs.startswith("0x")
            and all(c in "0123456789abcdefABCDEF" for c in fraud_proofs[2:])
        ):
            raise ConfigError("genesis app_state.evm.fraud_proofs_address: expected an EVM address")
        escrow = evm.get("escrow_address")
        if escrow is not None and not _is_address(escrow):
            raise ConfigError("genesis app_state.evm.escrow_address: expected an EVM address")
        operators: dict[str, str] = {}
        operator_map = doc.get("validators") or {}
        if not isinstance(operator_map, dict):
            raise ConfigError("genesis app_state.validators: expected an object")
        for key, value in operator_map.items():
            operator = value.get("operator") if isinstance(value, dict) else value
            if (
                not isinstance(operator, str)
                or not operator.startswith("0x")
                or len(operator) != 42
            ):
                raise ConfigError(f"genesis app_state.validators.{key}: expected an EVM address")
            operators[key] = operator
        credits = doc.get("credits")
        if credits is not None and (
            not isinstance(credits, dict)
            or not {"price_wei", "layer_tokens"} <= set(credits) <= _CREDIT_KEYS
        ):
            raise ConfigError(
                "genesis app_state.credits: expected {price_wei, layer_tokens[, lifetime_epochs]"
                "[, max_pending_mints][, relay_bytes][, key_period_blocks][, dkg_phase_blocks]"
                "[, holder_bound][, sign_blocks]}"
            )
        holder_bound = (credits or {}).get("holder_bound", False)
        if not isinstance(holder_bound, bool):
            raise ConfigError("genesis app_state.credits.holder_bound: expected true or false")
        period_blocks, phase_blocks = _key_periods(credits)
        return cls(
            epoch_length=_int(doc, "epoch_length", 20, 1),
            heartbeat_timeout=_int(doc, "heartbeat_timeout", 30, 1),
            challenges_per_epoch=_int(doc, "challenges_per_epoch", 0),
            registration_ttl=_int(doc, "registration_ttl", 100, 1),
            retention_epochs=_int(doc, "retention_epochs", 10, 1),
            prune_per_block=_int(doc, "prune_per_block", 10_000, 1),
            min_stake=min_stake,
            reputation=reputation,
            models=models,
            evm_chain_id=chain_id,
            committee_address=committee,
            fraud_proofs_address=fraud_proofs,
            operators=operators,
            escrow_address=escrow,
            verifier_cut_bps=_int(doc, "verifier_cut_bps", 1_000, 0, 10_000),
            spot_check_ppm=_int(doc, "spot_check_ppm", 50_000, 0, 1_000_000),
            spot_check_floor=_int(doc, "spot_check_floor", 1, 0, 1_000),
            commit_grace_epochs=_int(doc, "commit_grace_epochs", 2, 1, 1_000),
            replica_floor=_int(doc, "replica_floor", DEFAULT_REPLICA_FLOOR, 1, MAX_REPLICA_FLOOR),
            numerics=_numerics(doc),
            credit_price_wei=(
                _int(credits, "price_wei", 0, 1, (1 << 64) - 1) if credits is not None else None
            ),
            credit_layer_tokens=_int(credits, "layer_tokens", 0, 1) if credits is not None else 0,
            credit_lifetime_epochs=(
                _int(
                    credits,
                    "lifetime_epochs",
                    DEFAULT_CREDIT_LIFETIME_EPOCHS,
                    1,
                    MAX_CREDIT_LIFETIME_EPOCHS,
                )
                if credits is not None
                else DEFAULT_CREDIT_LIFETIME_EPOCHS
            ),
            credit_max_pending_mints=(
                _int(
                    credits,
                    "max_pending_mints",
                    DEFAULT_MAX_PENDING_MINTS,
                    1,
                    MAX_MAX_PENDING_MINTS,
                )
                if credits is not None
                else DEFAULT_MAX_PENDING_MINTS
            ),
            credit_relay_bytes=(
                _int(credits, "relay_bytes", DEFAULT_RELAY_BYTES, 1, MAX_RELAY_BYTES)
                if credits is not None
                else DEFAULT_RELAY_BYTES
            ),
            credit_key_period_blocks=period_blocks,
            credit_dkg_phase_blocks=phase_blocks,
            credit_holder_bound=holder_bound,
            credit_sign_blocks=(
                _int(credits, "sign_blocks", DEFAULT_SIGN_BLOCKS, 1, MAX_SIGN_BLOCKS)
                if credits is not None
                else DEFAULT_SIGN_BLOCKS
            ),
        )

    def to_json(self) -> dict[str, Any]:
        """The parsed parameters as stored in state (a default left out, so existing chains keep
        their app hash); `view` is what `/params` answers."""
        rep = self.reputation
        return {
            "epoch_length": self.epoch_length,
            "heartbeat_timeout": self.heartbeat_timeout,
            "challenges_per_epoch": self.challenges_per_epoch,
            "registration_ttl": self.registration_ttl,
            "retention_epochs": self.retention_epochs,
            "prune_per_block": self.prune_per_block,
            "min_stake": {role: str(amount) for role, amount in sorted(self.min_stake.items())},
            "reputation": {name: getattr(rep, name) for name in rep.__dataclass_fields__},
            "models": {model: {"shards": n} for model, n in sorted(self.models.items())},
            "evm": (
                {
                    "chain_id": self.evm_chain_id,
                    "committee_address": self.committee_address,
                    **(
                        {"fraud_proofs_address": self.fraud_proofs_address}
                        if self.fraud_proofs_address
                        else {}
                    ),
                    **({"escrow_address": self.escrow_address} if self.escrow_address else {}),
                }
                if self.committee_address
                else None
            ),
            "validators": dict(sorted(self.operators.items())),
            **(
                {"verifier_cut_bps": self.verifier_cut_bps}
                if self.verifier_cut_bps != 1_000
                else {}
            ),
            **({"spot_check_ppm": self.spot_check_ppm} if self.spot_check_ppm != 50_000 else {}),
            **({"spot_check_floor": self.spot_check_floor} if self.spot_check_floor != 1 else {}),
            **(
                {"commit_grace_epochs": self.commit_grace_epochs}
                if self.commit_grace_epochs != 2
                else {}
            ),
            **(
                {"replica_floor": self.replica_floor}
                if self.replica_floor != DEFAULT_REPLICA_FLOOR
                else {}
            ),
            **({"numerics": list(self.numerics)} if self.numerics != DEFAULT_NUMERICS else {}),
            **(
                {
                    "credits": {
                        "layer_tokens": self.credit_layer_tokens,
                        "lifetime_epochs": self.credit_lifetime_epochs,
                        **(
                            {"max_pending_mints": self.credit_max_pending_mints}
                            if self.credit_max_pending_mints != DEFAULT_MAX_PENDING_MINTS
                            else {}
                        ),
                        **(
                            {"relay_bytes": self.credit_relay_bytes}
                            if self.credit_relay_bytes != DEFAULT_RELAY_BYTES
                            else {}
                        ),
                        **(
                            {"key_period_blocks": self.credit_key_period_blocks}
                            if self.credit_key_period_blocks != DEFAULT_KEY_PERIOD_BLOCKS
                            else {}
                        ),
                        **(
                            {"dkg_phase_blocks": self.credit_dkg_phase_blocks}
                            if self.credit_dkg_phase_blocks != DEFAULT_DKG_PHASE_BLOCKS
                            else {}
                        ),
                        **({"holder_bound": True} if self.credit_holder_bound else {}),
                        **(
                            {"sign_blocks": self.credit_sign_blocks}
                            if self.credit_sign_blocks != DEFAULT_SIGN_BLOCKS
                            else {}
                        ),
                        "price_wei": str(self.credit_price_wei),
                    }
                }
                if self.credit_price_wei is not None
                else {}
            ),
        }

    def view(self) -> dict[str, Any]:
        """`/params`' `genesis`: the stored parameters, and `numerics` always (which versions a
        registration may announce is what nodes and verifiers read; a query, never hashed)."""
        return {**self.to_json(), "numerics": list(self.numerics)}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Genesis:
        """Inverse of `to_json` (used when the app restarts from its store)."""
        stored = dict(doc)
        if stored.get("evm") is None:
            stored.pop("evm", None)
        return cls.parse(json.dumps(stored).encode())
