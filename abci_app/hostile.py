"""TEST-ONLY Byzantine behaviour: makes this validator propose junk txs and extend junk votes.

Used by the e2e test that checks one misbehaving validator of four cannot stop or fork the other
three. It can never be switched on by accident: `python -m abci_app` needs BOTH the hidden flag
`--byzantine-test-mode` AND the environment variable `PLANET_ABCI_BYZANTINE` set to
`ARMED_VALUE`; either one alone makes the app refuse to start. Deterministic (no randomness):
the junk depends only on the height.
"""

from __future__ import annotations

import os

from protocol.errors import ConfigError

FLAG = "--byzantine-test-mode"
ENV = "PLANET_ABCI_BYZANTINE"
ARMED_VALUE = "yes-i-want-this-validator-to-misbehave"

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


def check_armed(flag: bool) -> bool:
    """Whether hostile mode is on; raises ConfigError when only one of the two switches is set."""
    armed = os.environ.get(ENV) == ARMED_VALUE
    if flag and not armed:
        raise ConfigError(f"{FLAG} also needs {ENV}={ARMED_VALUE} (test-only Byzantine mode)")
    if armed and not flag:
        raise ConfigError(f"{ENV} is set but {FLAG} is not: refusing to guess; unset {ENV}")
    return flag and armed


class Byzantine:
    """Replaces an honest validator's proposals and vote extensions with junk."""

    def proposal(self, height: int, txs: list[bytes], max_tx_bytes: int) -> list[bytes]:
        junk = JUNK_TXS[height % len(JUNK_TXS)]
        out = [*txs, junk]
        if sum(len(tx) + 8 for tx in out) > max_tx_bytes:
            return [junk] if len(junk) + 8 <= max_tx_bytes else txs
        return out

    def extension(self, height: int) -> bytes:
        return JUNK_EXTENSIONS[height % len(JUNK_EXTENSIONS)]
