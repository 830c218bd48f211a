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
import re
from typing import Any, Protocol

from protocol.committee.gateways import GatewayBind, sign_binding
from protocol.errors import ConfigError, RemoteError
from protocol.fields import is_int

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


_ADDRESS = re.compile(r"0x[0-9a-f]{40}\Z")
_KEY = re.compile(r"[0-9a-f]{64}\Z")


def _bound_to(answer: Any) -> str | None:
    """`/gateways?key=`'s `address`: a lowercase address or null, else `RemoteError`."""
    address = answer.get("address") if isinstance(answer, dict) else ""
    if address is not None and not (isinstance(address, str) and _ADDRESS.match(address)):
        raise RemoteError("committee", "bad_answer", f"/gateways: malformed {answer!r}"[:200])
    return address


def _latest(answer: Any) -> tuple[str, bool, int] | None:
    """`/gateways?address=`'s `binding` as (key, bound, nonce), or None; else `RemoteError`."""
    binding = answer.get("binding", "") if isinstance(answer, dict) else ""
    if binding is None:
        return None
    try:
        key, bound, nonce = binding["key"], binding["bound"], binding["nonce"]
        if _KEY.match(key) and isinstance(bound, bool) and is_int(nonce, 1, (1 << 64) - 1):
            return key, bound, nonce
    except (TypeError, KeyError):
        pass
    raise RemoteError("committee", "bad_answer", f"/gateways: malformed {answer!r}"[:200])


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
    mine = _bound_to(await link.query("/gateways", key=key))
    if mine == address:
        log.info("gateway key=%s is bound to address=%s", key, address)
        return False
    if mine is not None:
        raise ConfigError(
            f"this gateway's committee key {key} is bound to {mine}, not to its "
            f"wallet {address}: its fees would be paid there",
            hint="serve with the wallet that address belongs to, or a new committee key",
        )
    latest = _latest(await link.query("/gateways", address=address))
    if latest is not None and latest[1] and latest[0] != key:
        raise ConfigError(
            f"the wallet {address} is bound to another gateway key {latest[0]}",
            hint="serve with that key's committee_key.json, or a fresh wallet",
        )
    nonce = latest[2] + 1 if latest is not None else 1
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
    # a concurrent start bound it meanwhile: look again
    if (
        code == GATEWAY_ALREADY_BOUND
        and _bound_to(await link.query("/gateways", key=key)) == address
    ):
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
