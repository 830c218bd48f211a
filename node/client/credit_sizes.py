"""How many credits a client buys at once and pays at most: `MAX_BUY`, `MIN_POSITIONS`.

A module of its own, with no imports, so that `planet`'s argument parser (`planet credits`,
`planet gateway serve`) shows the defaults without loading the credit wallet's cryptography and
the EIP-712 codecs (`node.client.credit_wallet`, `node.client.paying`: ~0.3 s of every `planet`
start).
"""

from __future__ import annotations

# credits per mint a client draws: the chain's bound (protocol MAX_MINT; a test ties them)
MAX_BUY = 128
MIN_POSITIONS = 16  # a client's default floor: it never pays a credit per fewer positions
