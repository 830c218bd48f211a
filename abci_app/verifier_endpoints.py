"""Where each validator's verifier hands its findings to the others (`verifier_endpoint`).

A node may answer the one verifier a spot check is assigned to and withhold its ticket from the
rest; the finder then forwards the node-signed ticket itself (node/verifier/findings.py), from
the URL its validator published here:

    verifier_endpoint{url}   signer: a validator (its consensus key); url canonical
                             (protocol/urls.py); a later one replaces the earlier

Record `vurl/<signer key>` = {url, validator (address), height}. Query `/verifier_endpoints`:
`{"endpoints": {signer key: url}}`. Codes: NOT_VALIDATOR 14.
"""

from __future__ import annotations

from typing import Any

from abci_app import rules, schema
from abci_app.state import State
from protocol.committee.envelope import SignedTx
from protocol.committee.verification import VerifierEndpoint


def verifier_endpoint(state: State, tx: SignedTx) -> None:
    body: VerifierEndpoint = tx.body
    validator = rules.validator(state, tx.signer)
    state.put(
        schema.VERIFIER_ENDPOINT,
        tx.signer,
        {"url": body.url, "validator": validator["address"], "height": state.block_height},
    )
    state.emit("planet.verifier_endpoint", validator=validator["address"], url=body.url)


def endpoints(state: State, params: dict[str, Any]) -> Any:
    """`/verifier_endpoints`: every published URL by the signer key that published it."""
    return {
        "endpoints": {
            key: record["url"] for key, record in state.committed_items(schema.VERIFIER_ENDPOINT)
        }
    }
