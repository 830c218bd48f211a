"""The settlement timeline a payment must outlive, derived from the gateway's own schedule.

A question's charge reaches the chain in steps: the reporter batches it (at most
`report_max_wait_s`, checked every `report_every_s`), the committee commits the report
(`commit_margin_s`), the epoch that holds it ends (`epoch_blocks` × `block_time_s`), and the
committee signs and someone posts the epoch's payout root (`posting_margin_s`). Two rules follow:

    min_authorization_lifetime_s = report_max_wait_s + report_every_s + commit_margin_s
        a voucher or payment key must stay valid this long after the question, else 402
        `voucher_expiring` / `key_expiring`: the chain refuses a charge whose authorization
        expired, so an honest gateway never sends one that could have;

    refund_margin_s = report_max_wait_s + report_every_s + commit_margin_s
                      + epoch_blocks × block_time_s + posting_margin_s
        a per-query deposit whose refund opens sooner is refused (`payment_expiring`): its
        user could take it back before the root that charges it is posted. The escrow's
        `refundTimeout` (also the prepaid withdrawal delay) must be at least this long, or the
        gateway refuses to start (`check_refund_timeout`): with a shorter one every deposit
        would be refused, and a payer could withdraw a balance before its charges land.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from protocol.errors import ConfigError

DEFAULT_COMMIT_MARGIN_S = 120.0
DEFAULT_POSTING_MARGIN_S = 120.0
DEFAULT_BLOCK_TIME_S = 1.0


@dataclass(frozen=True, slots=True)
class Timeline:
    report_max_wait_s: float  # longest a charge waits in the reporter's batch (s)
    report_every_s: float  # the reporter's pass interval (s)
    epoch_blocks: int  # committee blocks per settlement epoch (genesis `epoch_length`)
    block_time_s: float = DEFAULT_BLOCK_TIME_S  # committee block interval (s)
    commit_margin_s: float = DEFAULT_COMMIT_MARGIN_S  # a report reaches a block within (s)
    posting_margin_s: float = DEFAULT_POSTING_MARGIN_S  # signing + posting the root (s)

    @property
    def min_authorization_lifetime_s(self) -> int:
        return math.ceil(self.report_max_wait_s + self.report_every_s + self.commit_margin_s)

    @property
    def refund_margin_s(self) -> int:
        return self.min_authorization_lifetime_s + math.ceil(
            self.epoch_blocks * self.block_time_s + self.posting_margin_s
        )

    def describe(self) -> str:
        return (
            f"report max wait {self.report_max_wait_s:g} s + reporter pass "
            f"{self.report_every_s:g} s + commit margin {self.commit_margin_s:g} s + epoch "
            f"{self.epoch_blocks} blocks × {self.block_time_s:g} s + posting margin "
            f"{self.posting_margin_s:g} s"
        )


def check_refund_timeout(refund_timeout_s: int, refund_margin_s: int, timeline: Timeline) -> None:
    """Refuse to start when the escrow lets deposits refund (and balances withdraw) before the
    gateway can settle them."""
    if refund_timeout_s < refund_margin_s:
        raise ConfigError(
            f"the escrow's refund timeout is {refund_timeout_s} s, shorter than the refund margin "
            f"of {refund_margin_s} s this gateway needs to settle a question ({timeline.describe()}"
            "): every per-query deposit would be refused, and a prepaid payer could withdraw "
            "before its charges are debited",
            hint="deploy QueryEscrow with a longer refund timeout (planet contracts deploy "
            "--refund-timeout), or shorten the reporting schedule (--report-max-wait) or "
            "pass a smaller --refund-margin-s knowingly",
        )
