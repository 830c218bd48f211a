"""Errors of the share accounting: every bad input to weights, payouts or an epoch close.

    ProtocolError (protocol.errors)
    ├── ShareInputError            an epoch's input breaks a rule; `field` and `reason` say which
    │   ├── CountError             a count/amount/id is not an integer in its range (negative, …)
    │   ├── AccountError           an account is not a `0x` + 40 hex EVM address
    │   ├── QueryIdError           a query id is not `0x` + 64 hex (bytes32)
    │   ├── BasisPointsError       a basis-points value is outside 0 … 10,000
    │   ├── DuplicateError         the same account / work item / query / shard / debit twice
    │   ├── PageError              an epoch's pages break a rule (empty page, charges outside)
    │   └── PoolHealthError        a shard with work has no, or too small, a routable-node count
    └── NothingToPayError          the epoch has fees but no eligible share (or no fees at all):
                                   no payout root can be built; the queries stay unsettled

The ABCI app builds these inputs from its own validated state, so any of them there is a bug in
the caller; they are `ProtocolError`s so that an input decoded from a peer is refused the same way.
"""

from __future__ import annotations

from protocol.errors import ProtocolError


class ShareInputError(ProtocolError):
    """An input of the share accounting is invalid: `field` says where, `reason` what."""

    code = "share_input_invalid"

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"invalid share input: {field}: {reason}")
        self.field = field
        self.reason = reason


class CountError(ShareInputError):
    """A count, amount or epoch is not an integer in its allowed range."""

    code = "share_count_out_of_range"

    def __init__(self, field: str, value: object, lo: int, hi: int) -> None:
        super().__init__(field, f"expected an integer in [{lo}, {hi}], got {value!r}"[:200])
        self.value = value


class AccountError(ShareInputError):
    """An account is not an EVM address spelled `0x` + 40 hex digits."""

    code = "share_account_invalid"

    def __init__(self, field: str, value: object) -> None:
        super().__init__(field, f"expected 0x + 40 hex digits, got {value!r}"[:200])


class QueryIdError(ShareInputError):
    """A query id is not a bytes32 spelled `0x` + 64 hex digits."""

    code = "share_query_id_invalid"

    def __init__(self, field: str, value: object) -> None:
        super().__init__(field, f"expected 0x + 64 hex digits, got {value!r}"[:200])


class BasisPointsError(ShareInputError):
    """A basis-points value is outside 0 … 10,000."""

    code = "share_bps_out_of_range"

    def __init__(self, field: str, value: object) -> None:
        super().__init__(field, f"expected basis points in [0, 10000], got {value!r}"[:200])


class DuplicateError(ShareInputError):
    """The same key (account, work item, query id, shard) appears twice in one list."""

    code = "share_duplicate"

    def __init__(self, field: str, key: object) -> None:
        super().__init__(field, f"duplicate entry {key!r}"[:200])
        self.key = key


class PageError(ShareInputError):
    """The pages of an epoch break a rule: a page that charges nothing, charges left in the
    epoch's `EpochWork`, arrays that do not pair up."""

    code = "share_page_invalid"


class PoolHealthError(ShareInputError):
    """A shard that has compute work lacks a routable-node count, or its count is smaller than
    the number of accounts that served it (every account that served a shard was routable on it)."""

    code = "share_pool_health_invalid"


class NothingToPayError(ProtocolError):
    """No payout root exists for this epoch: no fees, or no eligible (unslashed) share."""

    code = "share_nothing_to_pay"

    def __init__(self, epoch: int, reason: str) -> None:
        super().__init__(f"epoch {epoch}: nothing to pay: {reason}")
        self.epoch = epoch
        self.reason = reason
