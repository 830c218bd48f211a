"""`Staking`: bonds, unbonding, stake reads and the challengers' pull credits.

Roles: ROLE_COMPUTE 1, ROLE_VERIFIER 2, ROLE_RELAY 3; status: 0 None, 1 Active, 2 Unbonding.
Reads default to the sender's own account.
"""

from __future__ import annotations

from node.chain.evm.sender import Binding, TxResult


class Staking(Binding):
    NAME = "Staking"

    def stake(self, role: int, amount_wei: int) -> TxResult:
        """Bond `amount_wei` as `role` (ROLE_COMPUTE 1 / ROLE_VERIFIER 2 / ROLE_RELAY 3), or top
        it up."""
        return self.transact("stake", role, value=amount_wei)

    def request_unstake(self) -> TxResult:
        return self.transact("requestUnstake")

    def withdraw(self) -> TxResult:
        return self.transact("withdraw")

    def claim_credit(self) -> TxResult:
        """Pull the challenger rewards credited to this account."""
        return self.transact("claimCredit")

    def minimum_stake(self, role: int) -> int:
        """The least a `role` must bond (wei)."""
        return int(self.call("minimumStake", role))

    def stake_of(self, node: str | None = None) -> int:
        return self.call("stakeOf", node or self.sender.address)

    def role_of(self, node: str | None = None) -> int:
        return self.call("roleOf", node or self.sender.address)

    def status_of(self, node: str | None = None) -> int:
        """0 None, 1 Active, 2 Unbonding."""
        return self.call("statusOf", node or self.sender.address)

    def unbonding_at(self, node: str | None = None) -> int:
        return self.call("unbondingAt", node or self.sender.address)

    def is_eligible(self, node: str | None = None) -> bool:
        return self.call("isEligible", node or self.sender.address)

    def credit_of(self, account: str | None = None) -> int:
        return self.call("creditOf", account or self.sender.address)

    def locked_until(self, node: str | None = None) -> int:
        """Earliest withdrawal time set by recorded work (0: none)."""
        return self.call("lockedUntil", node or self.sender.address)

    def total_burned(self) -> int:
        return self.call("totalBurned")
