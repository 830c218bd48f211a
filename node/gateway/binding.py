"""A gateway binds its committee key to its wallet's address on the committee chain, once.

The chain pays a gateway's per-query fees and charges to the address its reporting key is bound
to (`gateway` tx, abci_app/gateway_bindings.py); no genesis list names gateways' addresses. So
at start `planet gateway serve` asks the committee (`/gateways?key=`): already bound to its own
wallet → nothing to do; unbound → it signs `GatewayBinding` with its wallet key (nonce: one above
the address's last binding, `/gateways?address=`), sends the `gateway` tx and says so in its log;
bound to another address, or its wallet bound to another key → it refuses to start, by name
(serving would earn fees it could never be paid).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from protocol.committee.gateways import GatewayBind, sign_binding
from protocol.errors import ConfigError

log = logging.getLogger(__name__)

GATEWAY_ALREADY_BOUND = 64  # abci_app/codes.py (the node layer cannot import it)


class BindingLink(Protocol):
    """What binding needs of `node.chain.committee_link.CommitteeLink`."""

    signer: str

    async def query(self, path: str, **params: Any) -> Any: ...

    async def send(self, body: Any, *, timeout_s: float = 15.0) -> tuple[int, str]: ...


def _domain(params: Any) -> tuple[str, int, str] | None:
    """(CometBFT chain id, EVM chain id, committee address) from the committee's `/params`;
    None when its genesis names no committee contract (such a chain settles nothing)."""
    try:
        genesis = params["genesis"]
        evm = genesis.get("evm") or {}
        chain_id = params["chain_id"]
    except (KeyError, TypeError, AttributeError):
        raise ConfigError(
            "the committee's /params is not a Planet committee's",
            hint="point --committee-rpc at a Planet committee validator",
        ) from None
    committee, evm_chain_id = evm.get("committee_address"), evm.get("chain_id")
    if not committee:
        return None
    if not isinstance(chain_id, str) or not isinstance(evm_chain_id, int):
        raise ConfigError("the committee's /params has a malformed chain id")
    return chain_id, evm_chain_id, str(committee)


async def ensure_bound(link: BindingLink, evm_key: bytes, address: str, params: Any) -> bool:
    """Bind `link`'s signer key to `address` (the wallet of `evm_key`) unless it already is;
    True when this call bound it. `ConfigError` when the key or the address is bound elsewhere
    or the chain refuses the binding; `UnavailableError` (from the link) when it does not land."""
    address = address.lower()
    key = link.signer
    domain = _domain(params)
    if domain is None:
        log.warning("the committee names no committee contract (no settlement): not binding")
        return False
    mine = await link.query("/gateways", key=key)
    if mine.get("address") == address:
        log.info("gateway key=%s is bound to address=%s", key, address)
        return False
    if mine.get("address") is not None:
        raise ConfigError(
            f"this gateway's committee key {key} is bound to {mine['address']}, not to its "
            f"wallet {address}: its fees would be paid there",
            hint="serve with the wallet that address belongs to, or a new committee key",
        )
    latest = (await link.query("/gateways", address=address)).get("binding")
    if latest is not None and latest.get("bound") and latest.get("key") != key:
        raise ConfigError(
            f"the wallet {address} is bound to another gateway key {latest['key']}",
            hint="serve with that key's committee_key.json, or a fresh wallet",
        )
    nonce = int(latest["nonce"]) + 1 if latest is not None else 1
    chain_id, evm_chain_id, committee = domain
    body: GatewayBind = sign_binding(
        evm_key,
        key,
        bound=True,
        nonce=nonce,
        chain_id=chain_id,
        evm_chain_id=evm_chain_id,
        committee_address=committee,
    )
    code, reason = await link.send(body)
    if code == GATEWAY_ALREADY_BOUND:  # a concurrent start bound it meanwhile: look again
        again = await link.query("/gateways", key=key)
        if again.get("address") == address:
            return False
    if code != 0:
        raise ConfigError(
            f"the committee refused this gateway's binding (code {code}): {reason}",
            hint="see docs/gateway.md, Binding the gateway's address",
        )
    log.info(
        "gateway bound: committee key=%s is now paid at address=%s (gateway tx, nonce %d); "
        "its users' fees are paid to this address",
        key,
        address,
        nonce,
    )
    return True
