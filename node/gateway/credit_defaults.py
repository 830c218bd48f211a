"""The hosted gateway's credit defaults (`planet gateway serve` flags).

Apart from the payer (node/gateway/credit_payer.py) so that the command line's --help and the
gateway's config read them without importing the payment stack.
"""

from __future__ import annotations

from node.client.credit_sizes import MIN_POSITIONS

MIN_CREDIT_POSITIONS = MIN_POSITIONS  # the floor: never a credit per fewer positions (16)
TOP_UP_BELOW = 100  # credits: the top-up buys when the wallet holds fewer (topup.py)
TOP_UP = 300  # credits bought per top-up, in mints of at most MAX_BUY (128)
MAX_TOP_UP = 100_000  # the most `--top-up` takes
