"""`VerdictRelay`: a validator's watcher relays every verdict the committee confirmed to the EVM
chain's FraudProofs (`slashByVerdict`), so a node convicted on the committee chain is slashed
without anyone relaying by hand.

One `step()`: `/verdicts?confirmed=true` (each with its signatures sorted by signer); for each
verdict not relayed yet, `FraudProofs.slashByVerdict(verdict, signatures)` from this validator's
operator key (it pays the gas). Every watcher relays; the contract uses a verdict's nonce once,
so the first relay slashes and the others answer `VerdictNonceUsed`, which counts as done. A
verdict for another FraudProofs (`WrongConsumer`) or with signatures the contract's committee
does not accept is logged and not retried. A verdict the committee confirmed by a numerics
version's quorum (abci_app/numerics.py) with less than 2/3 of all the power (`relayable`
false) is not sent until its signatures reach 2/3: the contract would refuse it. Meanwhile
this validator ratifies it (`ratifier`, node/watcher/ratifier.py: its operator's signature
over the same verdict, posted as `verdict_ratify`), as every honest validator's watcher does,
so the signatures reach 2/3 and a later pass relays it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from node.chain.evm.errors import ContractRevert
from node.watcher.ratifier import VerdictRatifier

log = logging.getLogger(__name__)

DONE = frozenset({"VerdictNonceUsed"})  # another relayer was first


class Committee(Protocol):
    async def query(self, path: str, **params: Any) -> Any: ...


class FraudProofs(Protocol):
    """The EVM side (`node.chain.evm.fraud_proofs.FraudProofs`, or a fake in unit tests)."""

    def relay_confirmed_verdict(self, record: dict[str, Any]) -> Any: ...


@dataclass
class VerdictRelay:
    committee: Committee
    fraud_proofs: FraudProofs
    ratifier: VerdictRatifier | None = None  # None: this watcher ratifies nothing
    relayed: set[str] = field(default_factory=set)  # verdict ids done (slashed or refused)

    async def step(self) -> list[str]:
        """One pass; the ids this watcher's transaction slashed for."""
        answer = await self.committee.query("/verdicts", confirmed="true")
        slashed = []
        for record in answer.get("verdicts", []):
            ident = str(record.get("id"))
            if ident in self.relayed:
                continue
            if record.get("relayable") is False:
                # convicted on the committee chain by its numerics version's quorum, short of
                # the 2/3 of all the power FraudProofs checks: not sent (it would revert) but
                # ratified; looked at again on each pass, as ratifications bring it to 2/3
                if self.ratifier is not None:
                    await self.ratifier.ratify(record)
                continue
            try:
                await asyncio.to_thread(self.fraud_proofs.relay_confirmed_verdict, record)
            except ContractRevert as error:  # final: the contract's answer will not change
                self.relayed.add(ident)
                if error.error_name not in DONE:
                    log.warning("verdict %s not relayed: %s", ident[:18], error.message)
                continue
            self.relayed.add(ident)
            log.info("relayed verdict %s node=%s", ident[:18], record.get("node"))
            slashed.append(ident)
        return slashed
