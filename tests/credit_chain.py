"""An in-process committee that sells credits: its first key period's committee key formed by
every validator's watcher logic (a real DKG on the chain), then mints, partial signatures,
credits and redemptions as the client and the validators make them. Shared by the credit tests.

    chain = credit_chain(tmp_path)                  key of period 0 formed at block 7 (each
                                                    validator's share under tmp_path/shares/)
    chain, node = node_chain(tmp_path)              … and a routable compute node (shards 0, 1)
                                                    priced at 1 position per credit on both
                                                    (`price=None`: unpriced)
    credits, req = minted(chain, tmp_path, 3)       a funded mint of 3, finalized by the client
    redeem(chain, node, credits)                    commit served positions + `credit_redeem`
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from nacl.signing import SigningKey

from abci_app import schema
from abci_app.codes import Code
from abci_app.threshold_queries import partials
from node.client.mint_request import MintRequest
from node.watcher.credit_dkg import plan
from node.watcher.mint_signer import sign_set
from protocol.blind_bls import ThresholdCredit
from protocol.committee.credits import CreditRedeem, FundMint, MintPartials
from protocol.committee.prices import SetPrice
from protocol.credit_periods import KeySchedule
from protocol.credit_shares import CreditShareStore
from protocol.threshold_mint import PeriodKey
from tests.committee_chain import EVM_CHAIN_ID, Chain, seeded_evm_key, seeded_key
from tests.unit.test_abci_settlement import ESCROW, ask, settled_chain
from tests.unit.test_abci_state import make_routable, price_txs, register, served_commit_tx
from tests.unit.test_credit_dkg_chain import play

NOW = 1_800_000_000
PRICE = 10**12
LAYER_TOKENS = 4096
PAYER = seeded_evm_key("credit-payer")
PERIOD_BLOCKS = 30  # period 0: blocks 1 … 30 (issue epoch 6 at 5 blocks an epoch)
PHASE = 2  # its DKG: blocks 2 … 7, the key formed at the end of block 7
SCHEDULE = KeySchedule(PERIOD_BLOCKS, PHASE)


def shares(tmp_path: Path, chain: Chain) -> list[CreditShareStore]:
    """Each validator's key share store (what its watcher writes and its app signs with): under
    the first `tmp_path` a chain was keyed with (kept on the chain object)."""
    directory = chain.__dict__.setdefault("credit_share_dir", tmp_path / "shares")
    return [CreditShareStore(directory / f"v{i}") for i in range(len(chain.validators))]


def ensure_key(chain: Chain, tmp_path: Path, max_blocks: int = 400) -> None:
    """Play the validators' DKG (their watchers' messages, block by block) until the next
    block's key period has its committee key: on a chain whose first run's deal blocks went by
    unplayed, the failed run's next attempt forms it."""
    stores = shares(tmp_path, chain)
    for _ in range(max_blocks):
        answer = ask(chain, "/credit_period")
        if ((answer.get("run") or {}).get("result") or {}).get("key"):
            for validator, store in zip(chain.validators, stores, strict=True):
                plan(answer, validator.key, store)  # each watcher's next pass: its share saved
            return
        play(chain, stores, int(answer["period"]), chain.state.height + 1)
    raise AssertionError(f"no committee key within {max_blocks} blocks")


def credit_chain(
    tmp_path: Path,
    lifetime_epochs: int | None = None,
    *,
    period_blocks: int = PERIOD_BLOCKS,
    credits_extra: dict[str, object] | None = None,
    **extra: object,
) -> Chain:
    """A chain with genesis credits (`credits_extra` added to them) whose period-0 key is
    formed (`shares`); `extra` overrides genesis keys (settled_chain)."""
    credits: dict[str, object] = {
        "price_wei": str(PRICE),
        "layer_tokens": LAYER_TOKENS,
        "key_period_blocks": period_blocks,
        "dkg_phase_blocks": PHASE,
        **(credits_extra or {}),
    }
    if lifetime_epochs is not None:
        credits["lifetime_epochs"] = lifetime_epochs
    chain = settled_chain(bindings={}, credits=credits, **extra)  # no gateway tx: DKG as planned
    chain.time_s = NOW
    ensure_key(chain, tmp_path)
    return chain


def node_chain(
    tmp_path: Path, lifetime_epochs: int | None = None, price: int | None = 1, **extra: object
) -> tuple[Chain, SigningKey]:
    """A credit chain and a routable node on shards 0, 1 that registered `price` positions
    per credit on both (None: no price; a redemption needs one, abci_app/prices.py)."""
    chain = credit_chain(tmp_path, lifetime_epochs, **extra)
    node = register(chain, "credit-node", shards=(0, 1))
    make_routable(chain, node)
    if price is not None:
        for shard in (0, 1):
            priced = send(chain, SetPrice("m", shard, price), node)
            assert priced.code == Code.OK, priced.log
    return chain, node


def epoch_now(chain: Chain) -> int:
    """The epoch of the next block."""
    return chain.state.height // chain.state.genesis.epoch_length + 1


def close_last_blocks_epoch(chain: Chain) -> int:
    """Advance to the end of the epoch the last block belongs to; returns that epoch."""
    length = chain.state.genesis.epoch_length
    epoch = (chain.state.height - 1) // length + 1
    chain.advance_to(epoch * length)
    return epoch


def period_key(chain: Chain, period: int | None = None) -> PeriodKey:
    """The formed key of `period` (default: the next block's)."""
    where = "" if period is None else f"?period={period}"
    return PeriodKey.from_answer(ask(chain, f"/credit_period{where}"))


def request(
    chain: Chain, count: int, payer: bytes = PAYER, expiry: int = NOW + 3600
) -> MintRequest:
    """A purchase of `count` credits under the next block's key period."""
    return MintRequest.create(period_key(chain), count, payer, PRICE, EVM_CHAIN_ID, ESCROW, expiry)


def send(chain: Chain, body: object, key: SigningKey | None = None) -> Any:
    [result] = chain.block([chain.tx(body, key or seeded_key("mint-sender"))])
    return result


def fund(chain: Chain, mint_id: str, vouchers: int | None = None) -> list[Any]:
    """The first `vouchers` validators (all by default) vouch for the mint in one block, as
    their watchers do once the payer's balance covers it (node/watcher/funding.py)."""
    validators = chain.validators[: len(chain.validators) if vouchers is None else vouchers]
    results = chain.block([chain.tx(FundMint(mint_id), v.key) for v in validators])
    assert all(r.code == Code.OK for r in results), [r.log for r in results]
    return results


def post_partials(
    chain: Chain, tmp_path: Path, mint_id: str, signers: Iterable[int] | None = None
) -> list[Any]:
    """`post_with` the validators' stores of this chain (`shares`)."""
    return post_with(chain, shares(tmp_path, chain), mint_id, signers)


def post_with(
    chain: Chain,
    stores: list[CreditShareStore],
    mint_id: str,
    signers: Iterable[int] | None = None,
) -> list[Any]:
    """The validators `signers` (indexes; all by default) post their partial signatures for a
    funded mint in one block, as their watchers do (node/watcher/mint_signer.py): those that
    posted before or hold no share of its period, or a mint not funded yet: nothing sent."""
    record = chain.state.committed(schema.MINT, mint_id)
    if record is None or record.get("funded_height") is None:
        return []
    chosen = set(range(len(chain.validators)) if signers is None else signers)
    run = ask(chain, f"/credit_period?period={record['period']}")["run"]
    txs = []
    for i, (validator, store) in enumerate(zip(chain.validators, stores, strict=True)):
        held = store.share(int(record["period"]))
        if i not in chosen or held is None:
            continue
        index, share = held
        if run["receivers"][index - 1][0] in record.get("signers", []):
            continue
        points = tuple(bytes.fromhex(p) for p in record["points"])
        txs.append(chain.tx(MintPartials(mint_id, sign_set(share, points)), validator.key))
    return chain.block(txs) if txs else []


def gather(chain: Chain, tmp_path: Path, mint_id: str) -> list[dict[str, Any]]:
    """Every validator's `/credit_partials` answer for the mint, once each posted its set."""
    post_partials(chain, tmp_path, mint_id)
    return [partials(chain.state, store, {"mint": mint_id}) for store in shares(tmp_path, chain)]


def minted(
    chain: Chain, tmp_path: Path, count: int = 3
) -> tuple[list[ThresholdCredit], MintRequest]:
    """A mint of `count` sent, funded by every validator and finalized by the client (two
    blocks, under the next block's key period; its key formed first where it is not yet)."""
    ensure_key(chain, tmp_path)
    req = request(chain, count)
    result = send(chain, req.body)
    assert result.code == Code.OK, result.log
    # the vouches and, right after them in the same block, every validator's partials (their
    # watchers post them once it is funded: one block here, as before partials were on chain)
    vouches = [chain.tx(FundMint(req.mint_id), v.key) for v in chain.validators]
    signed = []
    for validator, store in zip(chain.validators, shares(tmp_path, chain), strict=True):
        held = store.share(req.body.period)
        if held is not None:
            body = MintPartials(req.mint_id, sign_set(held[1], req.body.blinded))
            signed.append(chain.tx(body, validator.key))  # nonces after its vouch's
    results = chain.block([*vouches, *signed])
    assert all(r.code == Code.OK for r in results), [r.log for r in results]
    credits = req.finalize(period_key(chain, req.body.period), gather(chain, tmp_path, req.mint_id))
    return credits, req


def redeem(chain: Chain, node: SigningKey, credits: list[ThresholdCredit], shard: int = 0) -> Any:
    """The node commits the positions it served (one record: 32, a position per credit at
    least) and redeems, in one block: a redemption needs committed work (coverage.py)."""
    priced = price_txs(chain, node, shard)
    commit = served_commit_tx(chain, node, shard, blocks=max(1, -(-len(credits) // 32)))
    body = CreditRedeem("m", shard, tuple(credits))
    *_, result = chain.block([*priced, commit, chain.tx(body, node)])
    return result  # (a stranger's commit is refused: the redeem's own refusal is the point)
