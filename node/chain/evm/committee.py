"""`Committee`: the committee's members and powers on the EVM side, and their signed updates.

Its EIP-712 domain is the one the committee signs payout roots, verdicts, model registrations
and committee updates in.
"""

from __future__ import annotations

from collections.abc import Sequence

from node.chain.evm.sender import Binding, TxResult
from protocol.eip712 import CommitteeUpdate, Domain, committee_domain


class Committee(Binding):
    NAME = "Committee"

    def domain(self) -> Domain:
        """The EIP-712 domain of the committee's signatures."""
        return committee_domain(self.sender.chain_id, self.address)

    def members(self) -> list[str]:
        return list(self.call("members"))

    def nonce(self) -> int:
        return self.call("nonce")

    def update(self, update: CommitteeUpdate, signatures: Sequence[bytes]) -> TxResult:
        """Replace the members and powers on ≥ 2/3 of the current power's signatures."""
        return self.transact(
            "update",
            list(update.signers),
            list(update.powers),
            update.nonce,
            list(signatures),
        )
