"""Gateway bindings (`gateway` tx): which EVM address a gateway's committee key is paid at.

A per-query deposit names its gateway only in QueryEscrow, and the escrow pays a charged query's
fee only on a page that pays that gateway alone (docs/contracts.md). What the chain must know is
the address a reporting key's fees go to; it learns it from the address itself:

    gateway{address, bound, nonce, signature}   signer: the gateway's ed25519 committee key

`signature` is `address`'s EIP-712 signature over `GatewayBinding(gatewayKey = the signer,
gateway = address, bound, nonce, chain = keccak256(this chain's CometBFT chain id))` under the
committee domain (genesis `evm.chain_id`, `evm.committee_address`). Checked in this order:
- no committee domain in genesis → SETTLEMENT_DISABLED;
- the signature does not recover to `address` → GATEWAY_BINDING_INVALID (a forged binding; a
  binding signed for another key, chain, committee or flag — e.g. a front-runner resubmitting an
  observed signature under its own key — recovers to some other address);
- `nonce` not above the address's last binding nonce → GATEWAY_BINDING_REPLAYED (the nonce
  survives a release, so an old binding cannot be replayed after it);
- bind: the key already bound, or the address bound to another key → GATEWAY_ALREADY_BOUND
  (release first); release: the key is not bound to this address → GATEWAY_NOT_BOUND.

Effects: `gwaddr/<address>` = {key, bound, nonce, height} (kept after a release: the replay
guard), `gwkey/<key>` = {address, nonce, height} while bound. Event `planet.gateway {key,
address, bound, nonce}`. A bound key may send `work_report` (settlement.py): its query fees are
paid to its address and its charges must name it. Query `/gateways ?key ?address`.
"""

from __future__ import annotations

from typing import Any

from abci_app import rules, schema
from abci_app.codes import Code
from abci_app.query_params import ACCOUNT, NODE_KEY, limit_param, str_param
from abci_app.state import State
from protocol.committee.envelope import SignedTx
from protocol.committee.gateways import GatewayBind
from protocol.eip712 import GatewayBinding, committee_chain_hash, committee_domain, recover_digest
from protocol.errors import ProtocolError


def bound_address(state: State, key: str) -> str | None:
    """The lowercase address `key` is bound to, or None."""
    record = state.get(schema.GATEWAY_KEY, key)
    return None if record is None else str(record["address"])


def gateway(state: State, tx: SignedTx) -> None:
    body: GatewayBind = tx.body
    genesis = state.genesis
    if not (genesis.evm_chain_id and genesis.committee_address):
        rules.reject(Code.SETTLEMENT_DISABLED, "genesis has no evm {chain_id, committee_address}")
    binding = GatewayBinding(
        gateway_key=bytes.fromhex(tx.signer),
        gateway=body.address,
        bound=body.bound,
        nonce=body.nonce,
        chain=committee_chain_hash(state.chain_id),
    )
    domain = committee_domain(genesis.evm_chain_id, genesis.committee_address)
    try:
        signer = recover_digest(binding.digest(domain), bytes.fromhex(body.signature[2:]))
    except ProtocolError as error:
        rules.reject(Code.GATEWAY_BINDING_INVALID, f"binding signature: {error}")
    if signer.lower() != body.address:
        rules.reject(
            Code.GATEWAY_BINDING_INVALID,
            f"the binding is signed by {signer.lower()}, not by {body.address} for this key",
        )
    previous = state.get(schema.GATEWAY_ADDRESS, body.address)
    if previous is not None and body.nonce <= int(previous["nonce"]):
        rules.reject(
            Code.GATEWAY_BINDING_REPLAYED,
            f"nonce {body.nonce} is not above {previous['nonce']}, {body.address}'s last",
        )
    current = bound_address(state, tx.signer)
    if body.bound:
        if current is not None:
            rules.reject(Code.GATEWAY_ALREADY_BOUND, f"this key is bound to {current}")
        if previous is not None and previous["bound"]:
            rules.reject(
                Code.GATEWAY_ALREADY_BOUND, f"{body.address} is bound to key {previous['key']}"
            )
        state.put(
            schema.GATEWAY_KEY,
            tx.signer,
            {"address": body.address, "nonce": body.nonce, "height": state.block_height},
        )
    else:
        if current != body.address:
            rules.reject(Code.GATEWAY_NOT_BOUND, f"this key is not bound to {body.address}")
        state.delete(schema.GATEWAY_KEY, tx.signer)
    state.put(
        schema.GATEWAY_ADDRESS,
        body.address,
        {
            "key": tx.signer,
            "bound": body.bound,
            "nonce": body.nonce,
            "height": state.block_height,
        },
    )
    state.emit(
        "planet.gateway",
        key=tx.signer,
        address=body.address,
        bound=str(body.bound).lower(),
        nonce=body.nonce,
    )


def gateways(state: State, params: dict[str, Any]) -> Any:
    """`/gateways`: `?key` → {key, address (null: unbound), nonce, height}; `?address` → the
    address's latest binding record {address, key, bound, nonce, height} (null: never bound) —
    what a gateway reads to pick its next nonce; neither → a page of the bound keys
    {gateways: {key: address}, next}: at most `limit` (≤ 1000) keys in key order after `after`
    (a key), `next` the page's last key when more follow, else null (binding is free, so no
    answer lists every binding)."""
    key = str_param(params, "key", NODE_KEY)
    if key is not None:
        record = state.committed(schema.GATEWAY_KEY, key)
        return {"key": key, **(record or {"address": None, "nonce": None, "height": None})}
    address = str_param(params, "address", ACCOUNT)
    if address is not None:
        binding = state.committed(schema.GATEWAY_ADDRESS, address.lower())
        return {"address": address.lower(), "binding": binding}
    limit = limit_param(params)
    after = str_param(params, "after", NODE_KEY)
    page: dict[str, str] = {}
    start = "" if after is None else after + "0"  # past `after` itself (keys: 64 hex)
    for bound_key, record in state.committed_items(schema.GATEWAY_KEY, start):
        if len(page) == limit:
            return {"gateways": page, "next": list(page)[-1]}
        page[bound_key] = record["address"]
    return {"gateways": page, "next": None}
