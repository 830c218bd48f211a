"""A Byzantine committee app for tests: proposes junk txs and extends junk votes.

    python -m tests.byzantine_app --home DIR --listen tcp://127.0.0.1:26658

The same arguments as `python -m abci_app` (the repository root on PYTHONPATH): it serves
`ByzantineApp`, a `CommitteeApp` whose PrepareProposal appends a junk tx and whose ExtendVote
answers a junk extension. It executes the agreed blocks like any validator, so its app hash
stays the honest one. Used by the e2e test that checks one misbehaving validator of four cannot
stop or fork the other three. Deterministic (no randomness): the junk depends only on the height.
Never shipped: the product has no Byzantine mode.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from abci_app.__main__ import main
from abci_app.app import CommitteeApp, pb
from abci_app.machine import StateMachine

log = logging.getLogger("abci_app")

# Each is a tx the honest validators' ProcessProposal must refuse.
JUNK_TXS = (
    b"{",
    b"[" * 5000,
    b'{"body":{},"nonce":1e3,"sig":"","signer":"","type":"heartbeat"}',
    b'{"body":{"amount":"\xd9\xa1\xd9\xa2","node":"' + b"a" * 64 + b'"},"type":"attest_stake"}',
    b"\x00planet-vx/v1\n{}",
    b"\x0a\x05trunc",
)
# Each is a vote extension the honest validators' VerifyVoteExtension must refuse.
JUNK_EXTENSIONS = (
    b'{"epoch":1.5,"invalid":[],"scores":{}}',
    b"[" * 4000,
    b'{"epoch":NaN,"invalid":[],"scores":{}}',
    b'{"epoch":1,"epoch":1,"invalid":[],"scores":{}}',
    b"\xff\xfe",
)


def junk_proposal(height: int, txs: list[bytes], max_tx_bytes: int) -> list[bytes]:
    """The honest proposal plus one junk tx (only the junk when both do not fit)."""
    junk = JUNK_TXS[height % len(JUNK_TXS)]
    out = [*txs, junk]
    if sum(len(tx) + 8 for tx in out) > max_tx_bytes:
        return [junk] if len(junk) + 8 <= max_tx_bytes else txs
    return out


def junk_extension(height: int) -> bytes:
    return JUNK_EXTENSIONS[height % len(JUNK_EXTENSIONS)]


class ByzantineApp(CommitteeApp):
    """An honest app whose proposals and vote extensions are junk."""

    def __init__(self, machine: StateMachine, home: Path | None = None) -> None:
        super().__init__(machine, home)
        log.warning("BYZANTINE TEST APP: proposing and voting junk")

    def prepare_proposal(self, req: Any) -> Any:
        honest = super().prepare_proposal(req)
        txs = junk_proposal(req.height, list(honest.txs), req.max_tx_bytes)
        return pb.ResponsePrepareProposal(txs=txs)

    def extend_vote(self, req: Any) -> Any:
        return pb.ResponseExtendVote(vote_extension=junk_extension(req.height))


if __name__ == "__main__":
    sys.exit(main(app_class=ByzantineApp))
