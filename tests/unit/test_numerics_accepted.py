"""The chain accepts only the numerics versions its genesis lists (abci_app/genesis.py
`numerics`, abci_app/registry.py `_check_numerics`): a registration announcing a version no
verifier runs would escape every bitwise spot check (docs/verification.md, Limits, Numerics), so
it is refused by name (NUMERICS_NOT_ACCEPTED); a registration without the field is accepted and
judged by every check, as before."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from abci_app.codes import Code
from abci_app.genesis import DEFAULT_NUMERICS, MAX_ACCEPTED_NUMERICS, Genesis
from deploy.committee.genesis import app_state
from protocol.errors import ConfigError
from protocol.numerics import MAX_NUMERICS, NUMERICS
from tests.committee_chain import Chain, seeded_key
from tests.unit.test_abci_relays import send
from tests.unit.test_abci_state import ask, hexkey, node, register_body

pytestmark = pytest.mark.unit


def _announcing(label: str, numerics: int | None) -> Any:
    return dataclasses.replace(register_body(label), numerics=numerics)


def _nodes(chain: Chain) -> list[str]:
    return sorted(n["key"] for n in ask(chain, "/nodes")["nodes"])


# -- the registry --------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [999, MAX_NUMERICS, NUMERICS + 1, 1])
def test_register_node_announcing_a_version_the_genesis_does_not_list_is_refused_by_name(
    version: int,
) -> None:
    chain = Chain()  # no `numerics` in genesis: DEFAULT_NUMERICS
    assert version not in chain.state.genesis.numerics
    key = seeded_key("cheater")
    assert send(chain, _announcing("cheater", version), key) == Code.NUMERICS_NOT_ACCEPTED
    assert _nodes(chain) == []  # nothing written: no record, no EVM binding
    # the refused key registers again, announcing an accepted version
    assert send(chain, _announcing("cheater", DEFAULT_NUMERICS[0]), key) == Code.OK
    assert node(chain, key)["numerics"] == DEFAULT_NUMERICS[0]


def test_refusal_log_names_the_version_and_the_accepted_list() -> None:
    chain = Chain(genesis={"numerics": [2, 3]})
    [result] = chain.block([chain.tx(_announcing("cheater", 999), seeded_key("cheater"))])
    assert result.code == Code.NUMERICS_NOT_ACCEPTED
    assert "numerics 999" in result.log and "[2, 3]" in result.log


def test_every_listed_version_is_accepted_during_an_upgrade() -> None:
    chain = Chain(genesis={"numerics": [2, 3]})
    old, new = seeded_key("old"), seeded_key("new")
    assert send(chain, _announcing("old", 2), old) == Code.OK
    assert send(chain, _announcing("new", 3), new) == Code.OK
    assert send(chain, _announcing("other", 4), seeded_key("other")) == Code.NUMERICS_NOT_ACCEPTED
    assert node(chain, old)["numerics"] == 2 and node(chain, new)["numerics"] == 3
    assert _nodes(chain) == sorted([hexkey(old), hexkey(new)])


def test_a_version_dropped_from_the_list_is_refused() -> None:
    chain = Chain(genesis={"numerics": [3]})  # the upgrade finished: 2 is no longer run
    assert send(chain, _announcing("old", 2), seeded_key("old")) == Code.NUMERICS_NOT_ACCEPTED
    assert send(chain, _announcing("new", 3), seeded_key("new")) == Code.OK


def test_registration_without_the_field_is_accepted_on_any_list_as_before() -> None:
    for numerics in ([3], [2, 3], None):
        chain = Chain(genesis={} if numerics is None else {"numerics": numerics})
        key = seeded_key("old")
        assert send(chain, register_body("old"), key) == Code.OK
        assert "numerics" not in node(chain, key)  # unannounced: judged by every check


def test_the_rule_survives_a_restart_from_the_store(tmp_path: Path) -> None:
    chain = Chain(db=tmp_path / "state.db", genesis={"numerics": [3, 5]})
    chain.block([])
    again = chain.reopen()
    assert again.state.genesis.numerics == (3, 5)
    assert send(again, _announcing("n", 2), seeded_key("n")) == Code.NUMERICS_NOT_ACCEPTED
    assert send(again, _announcing("n", 5), seeded_key("n")) == Code.OK


# -- genesis -------------------------------------------------------------------------------------


def _parse(doc: dict[str, Any]) -> Genesis:
    return Genesis.parse(json.dumps(doc).encode())


@pytest.mark.parametrize(
    "value",
    [
        [],  # refused: every release that announces would be shut out (docs/committee.md)
        [2, 2],  # duplicates
        [3, 2],  # not ascending: one encoding per list
        [0],
        [-1],
        [MAX_NUMERICS + 1],
        [2**64],
        ["2"],
        [True],
        [None],
        [[2]],
        list(range(1, MAX_ACCEPTED_NUMERICS + 2)),  # too long
        2,
        "2",
        None,
        {"2": True},
    ],
)
def test_genesis_refuses_a_hostile_numerics_list_by_name(value: Any) -> None:
    with pytest.raises(ConfigError, match=r"genesis app_state\.numerics"):
        _parse({"numerics": value})


def test_genesis_refuses_a_float_version() -> None:
    with pytest.raises(ConfigError, match="floats are not allowed"):  # refused by the JSON reader
        _parse({"numerics": [2.0]})


def test_genesis_numerics_bounds_and_default() -> None:
    assert Genesis.parse(b"").numerics == DEFAULT_NUMERICS == (2,)
    longest = list(range(MAX_NUMERICS - MAX_ACCEPTED_NUMERICS + 1, MAX_NUMERICS + 1))
    assert _parse({"numerics": longest}).numerics == tuple(longest)
    assert _parse({"numerics": [1]}).numerics == (1,)


def test_genesis_stores_numerics_only_when_not_the_default_and_params_always_shows_it() -> None:
    default = Genesis.parse(b"")
    assert "numerics" not in default.to_json()  # existing chains keep their app hash
    assert default.view()["numerics"] == list(DEFAULT_NUMERICS)
    upgrade = _parse({"numerics": [2, 3]})
    assert upgrade.to_json()["numerics"] == [2, 3]
    assert Genesis.from_json(upgrade.to_json()) == upgrade
    assert Genesis.from_json(default.to_json()) == default
    assert ask(Chain(), "/params")["genesis"]["numerics"] == list(DEFAULT_NUMERICS)
    assert ask(Chain(genesis={"numerics": [2, 3]}), "/params")["genesis"]["numerics"] == [2, 3]


def test_devnet_genesis_accepts_this_releases_numerics() -> None:
    state = app_state({"AA": "0x" + "11" * 20}, epoch_length=5)
    assert state["numerics"] == [NUMERICS]
    assert _parse(state).numerics == (NUMERICS,)


def test_the_agent_knows_the_refusal_code() -> None:
    from node.agent.agent import NUMERICS_NOT_ACCEPTED

    assert Code.NUMERICS_NOT_ACCEPTED == NUMERICS_NOT_ACCEPTED == 105
