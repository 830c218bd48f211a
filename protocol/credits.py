"""Bearer credits: what a credit is, what a payer signs to buy credits, and the validity rule.

A credit is an RSA blind signature (RFC 9474, `protocol.blindrsa`, RSABSSA-SHA384-PSS-Randomized)
by validators of the committee over a message the client chose and the signers never saw:

    message  = CREDIT_DOMAIN ‖ nonce            nonce: 32 random bytes, drawn by the client
    prepared = prefix ‖ message                 prefix: RFC 9474's random 32 bytes
    credit   = (epoch, prepared, [(validator address, signature), ...])

`epoch` names the key set: each validator publishes one RSA key per epoch (`credit_key` tx),
and a credit minted in epoch e is signed with the keys of e. It is valid (`check_credit`) when
every listed signature verifies under its validator's key of that epoch and the listed
validators hold ≥ 2/3 of the power (`3·power ≥ 2·total`). Nothing in it names the payer: the
mint tx carries only blinded messages, and each blinded message is a uniformly random unit
mod n, independent of the message and of the finalized signature (the blinding inverse never
leaves the client).

What a payer signs to buy `count` credits (EIP-712, the payment domain of `protocol.payment`,
a struct of its own so that a gateway voucher can never be charged as a purchase or back):

    CreditPurchase(bytes32 mintId,uint64 credits,uint256 amount,uint64 expiry,address consumer)

Each validator has its own key, so a client blinds every credit once per validator key (a
uniformly random factor per key): a mint lists, per validator, its blinded messages.
`mintId = mint_id(payer, epoch, blinded)` binds the signature to exactly those blinded messages, so
nobody can reuse the payment for messages of their own. `amount = credits · price` (genesis
`credits.price_wei`); the committee records it as a prepaid charge (debited from the payer's
`QueryEscrow` balance in the epoch's payout root). Pure: integers, bytes, hashlib.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from protocol import blindrsa
from protocol.blindrsa import RsaPublicKey
from protocol.eip712 import TypedStruct
from protocol.errors import ProtocolError
from protocol.fields import is_int

CREDIT_DOMAIN = b"planet-credit/v1\n"
NONCE_BYTES = 32
PREPARED_BYTES = blindrsa.PREFIX_BYTES + len(CREDIT_DOMAIN) + NONCE_BYTES
MINT_DOMAIN = b"planet-mint/v1\n"
VARIANT = blindrsa.PSS_RANDOMIZED
FUND_EPOCHS = 1  # a mint of epoch e can be funded (`fund_mint`) in epochs e and e + 1


class CreditInvalidError(ProtocolError):
    """A credit that does not carry valid signatures of ≥ 2/3 of the power; `reason` says why."""

    code = "credit_invalid"

    def __init__(self, reason: str) -> None:
        super().__init__(f"invalid credit: {reason}")
        self.reason = reason


def credit_message(nonce: bytes) -> bytes:
    """The message a credit's signatures are over (before RFC 9474's random prefix)."""
    if len(nonce) != NONCE_BYTES:
        raise CreditInvalidError(f"a credit nonce is {NONCE_BYTES} bytes")
    return CREDIT_DOMAIN + nonce


def nonce_of(prepared: bytes) -> bytes:
    """The nonce inside a prepared credit message, or CreditInvalidError for any other shape."""
    if len(prepared) != PREPARED_BYTES:
        raise CreditInvalidError(f"a prepared credit message is {PREPARED_BYTES} bytes")
    message = prepared[blindrsa.PREFIX_BYTES :]
    if not message.startswith(CREDIT_DOMAIN):
        raise CreditInvalidError("the message is not a Planet credit")
    return message[len(CREDIT_DOMAIN) :]


def spent_id(prepared: bytes) -> str:
    """The spent-set key of a credit: sha256 of its nonce (one nonce is spent once, whatever the
    prefix), 64 lowercase hex."""
    return hashlib.sha256(nonce_of(prepared)).hexdigest()


def mint_id(payer: str, epoch: int, blinded: Mapping[str, tuple[bytes, ...]]) -> str:
    """`0x` + sha256 over MINT_DOMAIN, the lowercase payer, the epoch and, per validator address
    ascending, the address and its blinded messages (each length-prefixed): the mint's id, the
    `mintId` the payer signs."""
    digest = hashlib.sha256(MINT_DOMAIN + payer.lower().encode() + epoch.to_bytes(8, "big"))
    for address in sorted(blinded):
        digest.update(address.encode() + len(blinded[address]).to_bytes(2, "big"))
        for message in blinded[address]:
            digest.update(len(message).to_bytes(2, "big") + message)
    return "0x" + digest.hexdigest()


@dataclass(frozen=True, slots=True)
class CreditPurchase(TypedStruct):
    """The payer allows the committee to debit `amount` wei of its balance in `consumer` for
    `credits` credits of mint `mint_id`, until `expiry` (unix seconds)."""

    mint_id: bytes
    credits: int
    amount: int
    expiry: int
    consumer: str

    PRIMARY_TYPE: ClassVar[str] = "CreditPurchase"
    FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("mintId", "mint_id", "bytes32"),
        ("credits", "credits", "uint64"),
        ("amount", "amount", "uint256"),
        ("expiry", "expiry", "uint64"),
        ("consumer", "consumer", "address"),
    )


def sign_purchase(
    payer_key: bytes,
    identifier: str,
    count: int,
    price_wei: int,
    expiry: int,
    chain_id: int,
    escrow: str,
) -> tuple[int, str]:
    """(amount, "0x" signature): the payer's `CreditPurchase` of `count` credits at
    `price_wei` each for mint `identifier` ("0x" + 64 hex), bound to `escrow` on `chain_id`;
    either mint form (RSA or threshold) carries the two."""
    from protocol.payment import payment_domain  # eth_utils: only when a purchase is signed

    amount = count * price_wei
    purchase = CreditPurchase(
        mint_id=bytes.fromhex(identifier[2:]),
        credits=count,
        amount=amount,
        expiry=expiry,
        consumer=escrow,
    )
    return amount, "0x" + purchase.sign(payer_key, payment_domain(chain_id, escrow)).hex()


@dataclass(frozen=True, slots=True)
class Credit:
    """A finalized credit: the epoch of its keys, the prepared message, and one signature per
    listed validator (address uppercase hex, strictly ascending)."""

    epoch: int
    prepared: bytes
    signatures: tuple[tuple[str, bytes], ...]

    def to_json(self) -> list[object]:
        return [
            self.epoch,
            self.prepared.hex(),
            [[address, signature.hex()] for address, signature in self.signatures],
        ]


@dataclass(frozen=True, slots=True)
class EpochKeys:
    """The credit keys of one epoch: validator address → (public key, power), and total power."""

    epoch: int
    keys: Mapping[str, tuple[RsaPublicKey, int]]
    total_power: int


def epoch_keys_from_query(answer: Mapping[str, Any]) -> EpochKeys:
    """The typed key set of a `/credit_keys` query answer (each key parsed and size-checked)."""
    keys = {
        entry["validator"]: (RsaPublicKey.from_der(bytes.fromhex(entry["key"])), entry["power"])
        for entry in answer["keys"]
    }
    return EpochKeys(epoch=answer["epoch"], keys=keys, total_power=answer["total_power"])


MAX_LIFETIME_EPOCHS = 1_000_000  # abci_app/genesis.py MAX_CREDIT_LIFETIME_EPOCHS


def lifetime_from_query(answer: Mapping[str, Any]) -> int:
    """How many epochs after its own a credit stays redeemable, from a `/credit_keys` answer
    (1 where a validator does not say: the window before the genesis parameter existed)."""
    lifetime = answer.get("lifetime_epochs", 1)
    if not is_int(lifetime, 1, MAX_LIFETIME_EPOCHS):
        raise ProtocolError(f"/credit_keys: lifetime_epochs {lifetime!a} is not 1 … 10^6")
    return lifetime


def redeemable(credit_epoch: int, current: int, lifetime: int) -> bool:
    """The chain's redemption window (abci_app/credits.py): epoch e in e … e + lifetime."""
    return current - lifetime <= credit_epoch <= current


# a node's default redemption delay in blocks (`planet node serve --credit-margin-blocks`): it
# takes a credit only while the chain will still redeem it this many blocks on (`takeable`)
NODE_MARGIN_BLOCKS = 60
# a paying client drops credits nodes may refuse soon: twice the nodes' default margin, so one
# read of the chain's height serves its next checks (node/client/paying.py `CreditExpiry`)
CLIENT_MARGIN_BLOCKS = 2 * NODE_MARGIN_BLOCKS
MAX_EPOCH_LENGTH = 1 << 20  # blocks per epoch a /credit_keys answer may state
MAX_HEIGHT = (1 << 63) - 1


class CreditExpiringError(ProtocolError):
    """A credit whose redemption window ends too soon after the chain's latest height for the
    node that was shown it to redeem it in time (`takeable`)."""

    code = "credit_expiring"
    http_status = 402


@dataclass(frozen=True, slots=True)
class ChainClock:
    """The committee's time as one validator reports it: its latest committed height, the
    blocks per epoch and the credits' lifetime in epochs (a `/credit_keys` answer)."""

    height: int
    epoch_length: int
    lifetime: int
    period_blocks: int = 0  # credits.key_period_blocks (0: a chain from before key periods)

    @property
    def epoch(self) -> int:
        """The epoch of the next block (the one a tx sent now lands in at the earliest)."""
        return epoch_at(self.height + 1, self.epoch_length)


def epoch_at(height: int, epoch_length: int) -> int:
    """The epoch of a block height: heights (e−1)·L+1 … e·L are epoch e (abci_app/rules.py)."""
    return max(1, (height - 1) // epoch_length + 1)


def window_end(credit_epoch: int, lifetime: int, epoch_length: int) -> int:
    """The last height whose block still redeems a credit of `credit_epoch`: the last block of
    epoch e + lifetime (the chain redeems in a block of epoch c only when e ≤ c ≤ e + lifetime)."""
    return (credit_epoch + lifetime) * epoch_length


def takeable(credit_epoch: int, clock: ChainClock, margin_blocks: int) -> bool:
    """Whether a node takes a credit as pay at `clock.height`: the chain redeems credits of its
    epoch already (e ≤ the next block's epoch) and still will `margin_blocks` blocks after the
    latest committed one (h + M ≤ window_end). M is the node's redemption delay in blocks: a
    credit taken is then redeemable whenever the node redeems it within M blocks. Integers only."""
    if credit_epoch > clock.epoch:
        return False
    return clock.height + margin_blocks <= window_end(
        credit_epoch, clock.lifetime, clock.epoch_length
    )


def oldest_takeable_epoch(clock: ChainClock, margin_blocks: int) -> int:
    """The oldest credit epoch `takeable` at `clock` with `margin_blocks`:
    e ≥ ⌈(h + M) / L⌉ − lifetime."""
    return -(-(clock.height + margin_blocks) // clock.epoch_length) - clock.lifetime


def committed_height_from_query(answer: Mapping[str, Any], path: str) -> int:
    """The validator's latest committed height in a `/credit_keys` or `/credit_spent` answer
    (ProtocolError, by name, when it is missing or not a height: a validator from before it)."""
    height = answer.get("committed_height")
    if not is_int(height, 0, MAX_HEIGHT):
        raise ProtocolError(f"{path}: committed_height {height!a} is not a block height")
    return height


def clock_from_query(answer: Mapping[str, Any]) -> ChainClock:
    """The typed `ChainClock` of a `/credit_keys` answer (ProtocolError, by name, on an answer
    without a valid height, epoch length or lifetime)."""
    length = answer.get("epoch_length")
    if not is_int(length, 1, MAX_EPOCH_LENGTH):
        raise ProtocolError(f"/credit_keys: epoch_length {length!a} is not 1 … {MAX_EPOCH_LENGTH}")
    height = committed_height_from_query(answer, "/credit_keys")
    period_blocks = answer.get("key_period_blocks", 0)
    if not is_int(period_blocks, 0, MAX_HEIGHT):
        raise ProtocolError(f"/credit_keys: key_period_blocks {period_blocks!a} is not a count")
    return ChainClock(height, length, lifetime_from_query(answer), period_blocks)


def check_credit(keys: EpochKeys, credit: Credit) -> None:
    """Raise CreditInvalidError unless every listed signature verifies under its validator's key
    of `credit.epoch` and the signers hold ≥ 2/3 of the total power. Deterministic."""
    if credit.epoch != keys.epoch:
        raise CreditInvalidError(f"checked against the keys of epoch {keys.epoch}")
    nonce_of(credit.prepared)
    addresses = [address for address, _ in credit.signatures]
    if addresses != sorted(set(addresses)):
        raise CreditInvalidError("signatures must be strictly ascending by validator address")
    power = 0
    for address, signature in credit.signatures:
        entry = keys.keys.get(address)
        if entry is None:
            raise CreditInvalidError(f"validator {address} has no credit key in epoch {keys.epoch}")
        public, weight = entry
        try:
            blindrsa.verify(public, credit.prepared, signature, VARIANT)
        except blindrsa.BlindRsaError:
            raise CreditInvalidError(
                f"the signature of validator {address} does not verify"
            ) from None
        power += weight
    if 3 * power < 2 * keys.total_power:
        raise CreditInvalidError(f"signers hold {power} of {keys.total_power} power, under 2/3")
