"""`MintSigner` (node/watcher/mint_signer.py), each validator's watcher pass, against the
in-process committee: it posts its partials for every funded mint short of t, once, and the
chain keeps them; a row that does not parse is refused by name and skipped."""

from __future__ import annotations

import asyncio
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey

from abci_app import schema
from node.watcher.mint_signer import MintSigner, SigningAnswerError, signable
from tests.committee_chain import Chain
from tests.credit_chain import credit_chain, fund, request, send, shares
from tests.unit.test_abci_settlement import ask

pytestmark = pytest.mark.unit


class Link:
    """The watcher's committee link over the in-process chain, signing as one validator."""

    def __init__(self, chain: Chain, key: SigningKey) -> None:
        self.chain, self.key, self.sent = chain, key, []

    async def query(self, path: str, **params: Any) -> Any:
        return ask(self.chain, f"{path}?{urllib.parse.urlencode(params)}" if params else path)

    async def send(self, body: Any, *, timeout_s: float = 20.0) -> tuple[int, str]:
        self.sent.append(body)
        result = send(self.chain, body, self.key)
        return int(result.code), result.log


def _signer(chain: Chain, tmp_path: Path, index: int) -> tuple[MintSigner, Link]:
    link = Link(chain, chain.validators[index].key)
    return MintSigner(link, shares(tmp_path, chain)[index]), link


def test_mint_signer_posts_each_validators_partials_once_until_t(tmp_path: Path) -> None:
    chain = credit_chain(tmp_path, credits_extra={"sign_blocks": 50})
    req = request(chain, 3)
    assert send(chain, req.body).code == 0
    fund(chain, req.mint_id)
    signers = [_signer(chain, tmp_path, i) for i in range(4)]
    for signer, _ in signers[:3]:
        assert asyncio.run(signer.step()) == [req.mint_id]
    assert len(chain.state.committed(schema.MINT, req.mint_id)["signers"]) == 3
    # t reached: the mint leaves the signing list; nobody signs it again
    assert ask(chain, "/mints?signing=true")["mints"] == []
    for signer, _ in signers:
        assert asyncio.run(signer.step()) == []
    assert sum(len(link.sent) for _, link in signers) == 3


def test_mint_signer_skips_a_mint_it_signed_and_refuses_bad_rows_by_name() -> None:
    good = {"id": "0x" + "ab" * 32, "period": 0, "points": ["00" * 48], "signers": []}
    assert signable(good).mint == good["id"]
    for bad in (
        {**good, "id": "0x12"},
        {**good, "points": []},
        {**good, "points": ["zz" * 48]},
        {**good, "signers": "A" * 40},
        {**good, "period": -1},
        [],
    ):
        with pytest.raises(SigningAnswerError):
            signable(bad)
