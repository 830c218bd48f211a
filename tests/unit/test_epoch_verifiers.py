"""The spot-check verifier set fixed in each epoch record (abci_app/epochs.py): the validators
that committed a verifier seed for that epoch before it opened, on the in-process chain
(epoch_length 5, 4 validators)."""

from __future__ import annotations

import pytest

from abci_app.codes import Code
from tests.committee_chain import Chain
from tests.unit.test_abci_seeds_accusations import _signer, commit
from tests.unit.test_abci_state import ask

pytestmark = pytest.mark.unit


def _verifiers(chain: Chain, epoch: int) -> list[str]:
    [record] = ask(chain, f"/epochs?epoch={epoch}")["epochs"]
    return record["verifiers"]


def test_epoch_record_names_the_validators_that_committed_its_seed() -> None:
    chain = Chain()
    assert _verifiers(chain, 1) == []
    codes = chain.block([commit(chain, 2, 2, b"\x02" * 32), commit(chain, 0, 2, b"\x00" * 32)])
    assert [r.code for r in codes] == [Code.OK, Code.OK]  # height 1, epoch 1
    chain.advance_to(4)
    chain.block([commit(chain, 1, 3, b"\x01" * 32)])  # height 5: counts for epoch 3
    assert _verifiers(chain, 2) == sorted([_signer(chain, 0), _signer(chain, 2)])
    chain.advance_to(10)
    assert _verifiers(chain, 3) == [_signer(chain, 1)]  # committed during epoch 2 only
    chain.advance_to(15)
    assert _verifiers(chain, 4) == []  # nobody committed for epoch 4


def test_the_set_is_part_of_consensus_state() -> None:
    one, two = Chain(), Chain()
    for chain in (one, two):
        chain.block([commit(chain, 3, 2, b"\x03" * 32)])
        chain.advance_to(5)
    assert one.state.app_hash == two.state.app_hash
    other = Chain()
    other.block([commit(other, 1, 2, b"\x03" * 32)])
    other.advance_to(5)
    assert other.state.app_hash != one.state.app_hash
