"""Genesis app_state parsing and the InitChain adapter."""

from __future__ import annotations

import base64
import json

import pytest

from abci_app.app import CommitteeApp
from abci_app.genesis import Genesis
from abci_app.machine import StateMachine
from abci_app.proto import abci_pb
from abci_app.state import State, validator_address
from abci_app.store import Store
from protocol.errors import ConfigError, ProtocolError
from tests.committee_chain import seeded_key

pytestmark = pytest.mark.unit

OPERATOR = "0x" + "12" * 20


def test_abci_genesis_defaults_when_app_state_empty() -> None:
    genesis = Genesis.parse(b"")
    assert genesis.epoch_length == 20 and genesis.heartbeat_timeout == 30
    assert genesis.reputation.alpha == 400_000 and genesis.reputation.window == 5
    assert genesis.committee_address is None


def test_abci_genesis_parses_full_document_and_round_trips() -> None:
    doc = {
        "epoch_length": 7,
        "heartbeat_timeout": 9,
        "challenges_per_epoch": 2,
        "min_stake": {"compute": "5"},
        "reputation": {"tau": 250_000},
        "models": {"m": {"shards": 3}},
        "evm": {"chain_id": 31337, "committee_address": "0x" + "ab" * 20},
        "validators": {"AB" * 20: OPERATOR, "other": {"operator": OPERATOR}},
    }
    genesis = Genesis.parse(json.dumps(doc).encode())
    assert genesis.epoch_length == 7 and genesis.challenges_per_epoch == 2
    assert genesis.min_stake == {"compute": 5, "verifier": 5 * 10**17, "relay": 10**17}
    assert genesis.reputation.tau == 250_000 and genesis.models == {"m": 3}
    assert genesis.operators == {"AB" * 20: OPERATOR, "other": OPERATOR}
    assert Genesis.from_json(genesis.to_json()) == genesis


@pytest.mark.parametrize(
    "doc",
    [
        {"epoch_lenght": 5},
        {"epoch_length": 0},
        {"epoch_length": 1.5},
        {"reputation": {"alpha": 1}},
        {"models": {"m": {"shards": 0}}},
        {"evm": {"chain_id": "x"}},
        {"validators": {"A": "not-an-address"}},
        {"min_stake": {"gpu": "1"}},
        [],
    ],
)
def test_abci_genesis_invalid_app_state_raises_config_error(doc: object) -> None:
    with pytest.raises(ConfigError):
        Genesis.parse(json.dumps(doc).encode())


def test_abci_init_chain_maps_operators_by_address_or_base64_pubkey() -> None:
    pb = abci_pb()
    keys = [seeded_key(f"g{i}").verify_key.encode() for i in range(2)]
    app_state = {
        "validators": {
            validator_address(keys[0]): OPERATOR,
            base64.b64encode(keys[1]).decode(): "0x" + "34" * 20,
        }
    }
    request = pb.RequestInitChain(
        chain_id="c",
        app_state_bytes=json.dumps(app_state).encode(),
        validators=[pb.ValidatorUpdate(power=5, pub_key={"ed25519": key}) for key in keys],
    )
    request.consensus_params.abci.vote_extensions_enable_height = 2
    state = State(Store(":memory:"))
    response = CommitteeApp(StateMachine(state)).init_chain(request)
    assert response.app_hash == state.app_hash and len(state.app_hash) == 32
    operators = {v["address"]: v["operator"] for v in state.validators}
    assert operators[validator_address(keys[0])] == OPERATOR
    assert operators[validator_address(keys[1])] == "0x" + "34" * 20
    assert state.ve_enable_height == 2 and state.total_power == 10


def test_abci_init_chain_rejects_non_ed25519_validators() -> None:
    pb = abci_pb()
    request = pb.RequestInitChain(
        chain_id="c", validators=[pb.ValidatorUpdate(power=1, pub_key={"secp256k1": b"\x02" * 33})]
    )
    with pytest.raises(ProtocolError, match="ed25519"):
        CommitteeApp(StateMachine(State(Store(":memory:")))).init_chain(request)


def test_abci_genesis_fraud_proofs_address_parsed_and_checked() -> None:
    """The verdicts' consumer (FraudProofs) comes from genesis; a malformed one is refused."""
    evm = {"chain_id": 31337, "committee_address": "0x" + "ab" * 20}
    with_consumer = {"evm": {**evm, "fraud_proofs_address": "0x" + "cd" * 20}}
    genesis = Genesis.parse(json.dumps(with_consumer).encode())
    assert genesis.fraud_proofs_address == "0x" + "cd" * 20
    assert genesis.to_json()["evm"]["fraud_proofs_address"] == "0x" + "cd" * 20
    assert Genesis.parse(json.dumps({"evm": evm}).encode()).fraud_proofs_address is None
    for bad in ("0x12", 5, "0x" + "zz" * 20):
        with pytest.raises(ConfigError, match="fraud_proofs_address"):
            Genesis.parse(json.dumps({"evm": {**evm, "fraud_proofs_address": bad}}).encode())
