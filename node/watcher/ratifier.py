"""`VerdictRatifier`: a validator's watcher ratifies each verdict its committee chain confirmed
by a numerics version's quorum, so that the verdict's signatures reach the 2/3 of all the
power FraudProofs checks (abci_app/ratifications.py says why that is sound).

For a confirmed record of `/verdicts` that is not `relayable` yet and that this validator's
operator has not signed (neither voted nor ratified): rebuild its `Verdict` for this
deployment's FraudProofs, check that its struct hash is the record's id (so what is signed is
exactly the verdict the chain confirmed, for the contract that consumes it), sign it with the
operator key in the committee domain and send `verdict_ratify`. Each verdict once: in a block
(OK), or there before (DUPLICATE_VOTE) is done; any other refusal is logged and not retried
(the chain's answer will not change), except a nonce another signer took (BAD_NONCE after the
link's own retries) or a tx not committed in time (`UnavailableError`): sent again next pass.

Trust: the watcher signs what its committee RPC says is confirmed, as it already signs the
payout statements it reads there (node/watcher/payouts.py): point `--committee-rpc` at the
validator's own node, whose committed state it attests.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from node.chain.committee_link import BAD_NONCE
from node.chain.committee_rpc import TxRejectedError
from protocol.committee.verification import VerdictRatify
from protocol.eip712 import Domain, Verdict, address_of

log = logging.getLogger(__name__)

OK = 0
DUPLICATE_VOTE = 21  # abci_app/codes.py: this validator's signature is on the verdict already


class Committee(Protocol):
    async def send(self, body: Any, *, timeout_s: float = ...) -> tuple[int, str]: ...


def verdict_of(record: dict[str, Any], consumer: str) -> Verdict:
    """The `Verdict` a `/verdicts` record names, for the FraudProofs at `consumer`."""
    return Verdict(
        node=str(record["node"]),
        offence=int(record["offence"]),
        evidence_hash=bytes.fromhex(str(record["evidence_hash"])[2:]),
        challenger=str(record["challenger"]),
        nonce=int(record["nonce"]),
        consumer=consumer,
    )


@dataclass
class VerdictRatifier:
    committee: Committee
    operator_key: bytes
    domain: Domain  # the committee EIP-712 domain (chain id, Committee contract)
    fraud_proofs_address: str  # the consumer every verdict of this deployment names
    ratified: set[str] = field(default_factory=set)  # verdict ids done (or never ratifiable)

    @property
    def operator(self) -> str:
        return address_of(self.operator_key)

    async def ratify(self, record: dict[str, Any]) -> bool:
        """Ratify one confirmed, unrelayable record unless done; True when this call's
        ratification is now in a block."""
        ident = str(record["id"])
        if ident in self.ratified:
            return False
        if self.operator.lower() in {str(s).lower() for s in record.get("signers", [])}:
            self.ratified.add(ident)  # voted on it (or ratified before a restart)
            return False
        verdict = verdict_of(record, self.fraud_proofs_address)
        if "0x" + verdict.struct_hash().hex() != ident:
            self.ratified.add(ident)
            log.warning("verdict %s is not for FraudProofs %s: not ratified", ident[:18],
                        self.fraud_proofs_address)  # fmt: skip
            return False
        signature = verdict.sign(self.operator_key, self.domain)
        body = VerdictRatify(verdict=ident, signature="0x" + signature.hex())
        try:
            code, text = await self.committee.send(body)
        except TxRejectedError as error:
            code, text = error.tx_code, error.log_text
        if code not in (OK, DUPLICATE_VOTE):
            log.warning("verdict_ratify %s refused code=%d %s", ident[:18], code, text)
        if code == BAD_NONCE:
            return False  # nothing changed on chain: signed and sent again next pass
        self.ratified.add(ident)
        if code == OK:
            log.info("ratified verdict %s node=%s", ident[:18], record.get("node"))
        return code == OK
