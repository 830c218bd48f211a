"""Bearer credits: what a payer signs to buy credits, and the chain's time a credit is taken by.

A credit is a threshold blind BLS signature by the committee's key of one key period
(`protocol.blind_bls.ThresholdCredit`; the mint id and the period's window:
`protocol.threshold_mint`). Nothing in it names the payer: the mint tx carries only blinded
points, and the blinding factors never leave the client.

What a payer signs to buy `count` credits (EIP-712, the payment domain of `protocol.payment`,
a struct of its own so that a gateway voucher can never be charged as a purchase or back):

    CreditPurchase(bytes32 mintId,uint64 credits,uint256 amount,uint64 expiry,address consumer)

`mintId = threshold_mint_id(payer, period, blinded)` binds the signature to exactly those
blinded points, so nobody can reuse the payment for points of their own. `amount = credits ·
price` (genesis `credits.price_wei`); the committee records it as a prepaid charge (debited from
the payer's `QueryEscrow` balance in the epoch's payout root). Pure: integers, bytes, hashlib.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from protocol.eip712 import TypedStruct
from protocol.errors import ProtocolError
from protocol.fields import is_int

FUND_EPOCHS = 1  # a mint of epoch e can be funded (`fund_mint`) in epochs e and e + 1


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
    `price_wei` each for mint `identifier` ("0x" + 64 hex), bound to `escrow` on `chain_id`:
    what a `credit_mint` carries."""
    from protocol.payment import payment_domain  # only when a purchase is signed

    amount = count * price_wei
    purchase = CreditPurchase(
        mint_id=bytes.fromhex(identifier[2:]),
        credits=count,
        amount=amount,
        expiry=expiry,
        consumer=escrow,
    )
    return amount, "0x" + purchase.sign(payer_key, payment_domain(chain_id, escrow)).hex()


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
    holder_bound: bool = False  # credits.holder_bound: a credit must come with its assignment

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
    holder_bound = answer.get("holder_bound", False)
    if not isinstance(holder_bound, bool):
        raise ProtocolError(f"/credit_keys: holder_bound {holder_bound!a} is not true or false")
    return ChainClock(height, length, lifetime_from_query(answer), period_blocks, holder_bound)
